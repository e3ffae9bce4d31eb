//! What the host has for members (its cores, its memory, its data dir's
//! disk) and what the agent keeps back for itself and the system: sent
//! with every join and heartbeat, so that placement knows what is left.

use std::path::Path;

use herd_core::api::NodeResources;
use herd_core::quantity::{Bytes, Millicores};
use herd_core::resources::Amounts;

/// The operator's word on the host's resources: what to take as its
/// capacity instead of what is measured (several agents on one host, a
/// host shared with other work), and what to keep back.
#[derive(Clone, Debug, Default)]
pub struct ResourceFlags {
    pub cpu: Option<Millicores>,
    pub memory: Option<Bytes>,
    pub disk: Option<Bytes>,
    pub reserved: Amounts,
}

impl ResourceFlags {
    /// The capacity (each part given, or measured) and the reserve. A
    /// part that cannot be measured is reported as none.
    pub fn report(&self, data_dir: &Path) -> NodeResources {
        let capacity = Amounts {
            cpu: self.cpu.unwrap_or_else(cores),
            memory: self.memory.or_else(memory).unwrap_or_default(),
            disk: self
                .disk
                .or_else(|| crate::fsutil::disk_space(data_dir).ok().map(|(_, total)| Bytes(total)))
                .unwrap_or_default(),
        };
        NodeResources { capacity, reserved: self.reserved }
    }
}

/// The cores this process may run on (its CPU affinity and quota).
fn cores() -> Millicores {
    let count = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    Millicores(count as u64 * 1000)
}

/// The host's memory, from `/proc/meminfo`.
fn memory() -> Option<Bytes> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    mem_total(&text)
}

/// `MemTotal:  24576000 kB` read as bytes.
fn mem_total(meminfo: &str) -> Option<Bytes> {
    let line = meminfo.lines().find_map(|line| line.strip_prefix("MemTotal:"))?;
    let kib: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(Bytes(kib.checked_mul(1024)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_read_from_meminfo_and_flags_win_over_what_is_measured() {
        let text = "MemTotal:       24576000 kB\nMemFree:         1000 kB\n";
        assert_eq!(mem_total(text), Some(Bytes(24_576_000 * 1024)));
        assert_eq!(mem_total("MemFree: 3 kB\n"), None);
        assert_eq!(mem_total("MemTotal: lots\n"), None);

        let dir = tempfile::tempdir().unwrap();
        let measured = ResourceFlags::default().report(dir.path());
        assert!(measured.capacity.cpu >= Millicores(1000), "{measured:?}");
        assert!(measured.capacity.memory > Bytes(0) && measured.capacity.disk > Bytes(0), "{measured:?}");
        let given = ResourceFlags {
            cpu: Some(Millicores(500)),
            memory: Some(Bytes(1 << 30)),
            disk: None,
            reserved: Amounts { memory: Bytes(1 << 28), ..Default::default() },
        };
        let report = given.report(dir.path());
        assert_eq!((report.capacity.cpu, report.capacity.memory), (Millicores(500), Bytes(1 << 30)));
        assert_eq!(report.capacity.disk, measured.capacity.disk);
        assert_eq!(report.reserved.memory, Bytes(1 << 28));
    }
}
