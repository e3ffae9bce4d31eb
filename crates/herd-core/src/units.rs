//! Sizes and ages as people read them in messages: `311 MB`, `4.0 KB`, `3m`.

use std::time::Duration;

/// Bytes in decimal units (as `df -H` shows them), one decimal below 10.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KB", "MB", "GB", "TB", "PB"];
    if bytes < 1000 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1000.0;
    let mut unit = 0;
    while value >= 1000.0 && unit + 1 < UNITS.len() {
        value /= 1000.0;
        unit += 1;
    }
    if value < 10.0 { format!("{value:.1} {}", UNITS[unit]) } else { format!("{value:.0} {}", UNITS[unit]) }
}

/// A short age like `5s`, `3m`, `2h`, `4d`.
pub fn short_duration(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_df_shows_them() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(999), "999 B");
        assert_eq!(human_bytes(4096), "4.1 KB");
        assert_eq!(human_bytes(311_000_000), "311 MB");
        assert_eq!(human_bytes(64 << 20), "67 MB");
        assert_eq!(human_bytes(u64::MAX), "18447 PB");
    }

    #[test]
    fn durations() {
        assert_eq!(short_duration(Duration::from_secs(5)), "5s");
        assert_eq!(short_duration(Duration::from_secs(600)), "10m");
        assert_eq!(short_duration(Duration::from_secs(3 * 86_400)), "3d");
    }
}
