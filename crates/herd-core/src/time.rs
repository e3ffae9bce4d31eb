//! Wall-clock timestamps and human-readable durations as they appear in objects.
//!
//! Timestamps are RFC 3339 strings on the wire (`2026-11-29T13:31:00.123Z`);
//! durations are humantime strings (`15s`, `1m 30s`). The current time is
//! always passed in by the caller: this crate never reads a clock.

use std::borrow::Cow;
use std::fmt;
use std::time::{Duration, SystemTime};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A point in wall-clock time, serialised as RFC 3339 with milliseconds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(SystemTime);

/// The Unix epoch: only a placeholder for fields the server always sets.
impl Default for Timestamp {
    fn default() -> Self {
        Timestamp(SystemTime::UNIX_EPOCH)
    }
}

impl Timestamp {
    pub fn from_system_time(time: SystemTime) -> Self {
        // Millisecond precision is what the wire format keeps; truncate here so
        // that a value survives a round trip through JSON unchanged.
        let since = time.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
        let millis = Duration::from_millis(since.as_millis() as u64);
        Timestamp(SystemTime::UNIX_EPOCH + millis)
    }

    pub fn system_time(self) -> SystemTime {
        self.0
    }

    /// How long ago this was, seen from `now`; zero if it lies in the future.
    pub fn age(self, now: Timestamp) -> Duration {
        now.0.duration_since(self.0).unwrap_or_default()
    }

    /// This time and `duration` later (at most the latest time there is).
    pub fn plus(self, duration: Duration) -> Timestamp {
        let later = self.0.checked_add(duration).unwrap_or_else(|| self.0 + MAX_DURATION);
        Timestamp::from_system_time(later)
    }

    pub fn parse(text: &str) -> Result<Self, humantime::TimestampError> {
        humantime::parse_rfc3339_weak(text).map(Timestamp::from_system_time)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_rfc3339_millis(self.0))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        Timestamp::parse(&text).map_err(|e| serde::de::Error::custom(format!("not an RFC 3339 timestamp: {e}")))
    }
}

impl JsonSchema for Timestamp {
    fn schema_name() -> Cow<'static, str> {
        "Timestamp".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "format": "date-time" })
    }
}

/// A duration written the way people write it: `15s`, `2m`, `1h 30m`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

/// The longest duration anything takes: ten years (of 365.25 days, as
/// humantime counts them).
pub const MAX_DURATION: Duration = Duration::from_secs(315_576_000);

impl HumanDuration {
    pub const fn from_secs(secs: u64) -> Self {
        HumanDuration(Duration::from_secs(secs))
    }
    pub fn get(self) -> Duration {
        self.0
    }

    /// Reads `15s`, `2m`, `1h 30m`; a negative duration is named as such
    /// rather than reported as a stray character, and one over
    /// [`MAX_DURATION`] is refused (no setting means centuries, and every
    /// time it is added to stays representable).
    pub fn parse(text: &str) -> Result<Self, String> {
        if text.trim_start().starts_with('-') {
            return Err(format!("{text:?} is negative: a duration must be 0 or more, like 15s or 2m"));
        }
        let parsed =
            humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration like 15s or 2m: {e}"))?;
        if parsed > MAX_DURATION {
            return Err(format!("{text:?} is longer than {}, the longest duration", HumanDuration(MAX_DURATION)));
        }
        Ok(HumanDuration(parsed))
    }
}

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = Cow::<str>::deserialize(deserializer)?;
        HumanDuration::parse(&text).map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({ "type": "string", "description": "a duration such as 15s, 2m or 1h 30m" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamp_round_trips_through_json() {
        let t = Timestamp::from_system_time(SystemTime::UNIX_EPOCH + Duration::from_micros(1_700_000_000_123_456));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"2023-11-14T22:13:20.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
    }

    #[test]
    fn duration_parses_human_text() {
        let d: HumanDuration = serde_json::from_str("\"1m 30s\"").unwrap();
        assert_eq!(d.get(), Duration::from_secs(90));
        assert!(serde_json::from_str::<HumanDuration>("\"soon\"").is_err());
        let negative = HumanDuration::parse("-1s").unwrap_err();
        assert!(negative.contains("is negative"), "{negative}");
        let huge = HumanDuration::parse("18446744073709551615s").unwrap_err();
        assert!(huge.contains("is longer than 10years"), "{huge}");
        assert_eq!(HumanDuration::parse("10years").map(HumanDuration::get), Ok(MAX_DURATION));
    }
}
