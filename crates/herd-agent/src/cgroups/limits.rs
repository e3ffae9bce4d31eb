//! What a member's resources become in its cgroup's files, for each
//! layout. Pure: the files and values, in the order they are written.
//!
//! The memory request is protected, not capped: v2's `memory.low`, v1's
//! soft limit (reclaimed from last under pressure). A hard cap is only
//! `memoryMax`. CPU is shared by weight in proportion to the request (as
//! Kubernetes converts millicores to shares, and shares to v2 weights);
//! `cpuMax` is a quota per 100 ms period. `memoryMax` caps swap too (v1's
//! memory+swap limit, v2's `memory.swap.max` at 0), where the host
//! accounts for swap: a member at its cap is killed, not swapped out to
//! crawl on.

use herd_core::resources::Resources;

/// The CFS period quotas are given per.
const CPU_PERIOD_MICROS: u64 = 100_000;
/// The least share a member gets: one that requests no CPU.
const MIN_SHARES: u64 = 2;
const MAX_SHARES: u64 = 262_144;

/// One value to write: the controller whose directory holds the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Setting {
    pub controller: &'static str,
    pub file: &'static str,
    pub value: String,
    /// Written only where the file is (swap's, on a host that accounts
    /// for swap).
    pub optional: bool,
}

fn set(controller: &'static str, file: &'static str, value: impl ToString) -> Setting {
    Setting { controller, file, value: value.to_string(), optional: false }
}

fn set_if_there(controller: &'static str, file: &'static str, value: impl ToString) -> Setting {
    Setting { optional: true, ..set(controller, file, value) }
}

/// v1 `cpu.shares` for a request: 1024 a core.
pub fn shares(millicores: u64) -> u64 {
    (millicores.saturating_mul(1024) / 1000).clamp(MIN_SHARES, MAX_SHARES)
}

/// v2 `cpu.weight` (1..10000) for a request, through its shares.
pub fn weight(millicores: u64) -> u64 {
    1 + (shares(millicores) - MIN_SHARES) * 9999 / (MAX_SHARES - MIN_SHARES)
}

fn quota(resources: &Resources) -> Option<u64> {
    resources.cpu_max.map(|max| (max.0 * CPU_PERIOD_MICROS / 1000).max(1000))
}

/// The settings of a v1 member cgroup (every one written, so that a
/// cgroup used again loses the limits of a run before).
pub fn legacy(resources: &Resources) -> Vec<Setting> {
    let request = resources.requests();
    let unlimited = "-1".to_string();
    let memory_max = resources.memory_max.map_or(unlimited.clone(), |m| m.0.to_string());
    vec![
        set("memory", "memory.soft_limit_in_bytes", resources.memory.map_or(unlimited.clone(), |m| m.0.to_string())),
        // Memory+swap is never under memory: lifted first, set after.
        set_if_there("memory", "memory.memsw.limit_in_bytes", &unlimited),
        set("memory", "memory.limit_in_bytes", &memory_max),
        set_if_there("memory", "memory.memsw.limit_in_bytes", memory_max),
        // The peak is the run's: reset at every start.
        set("memory", "memory.max_usage_in_bytes", 0),
        set("cpu", "cpu.shares", shares(request.cpu.0)),
        set("cpu", "cpu.cfs_period_us", CPU_PERIOD_MICROS),
        set("cpu", "cpu.cfs_quota_us", quota(resources).map_or(unlimited, |q| q.to_string())),
        set("pids", "pids.max", resources.pids_max()),
    ]
}

/// The settings of a v2 member cgroup.
pub fn unified(resources: &Resources) -> Vec<Setting> {
    let request = resources.requests();
    let max = |value: Option<u64>| value.map_or("max".to_string(), |v| v.to_string());
    vec![
        set("memory", "memory.low", request.memory.0),
        set("memory", "memory.max", max(resources.memory_max.map(|m| m.0))),
        set_if_there("memory", "memory.swap.max", max(resources.memory_max.map(|_| 0))),
        set("cpu", "cpu.weight", weight(request.cpu.0)),
        set("cpu", "cpu.max", format!("{} {CPU_PERIOD_MICROS}", max(quota(resources)))),
        set("pids", "pids.max", resources.pids_max()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::quantity::{Bytes, Millicores};

    fn value<'a>(settings: &'a [Setting], file: &str) -> &'a str {
        &settings.iter().find(|s| s.file == file).unwrap().value
    }

    #[test]
    fn cpu_weight_follows_the_request() {
        assert_eq!((shares(0), shares(100), shares(1000), shares(2500)), (2, 102, 1024, 2560));
        assert_eq!(shares(u64::MAX), MAX_SHARES);
        assert_eq!((weight(0), weight(1000), weight(256_000)), (1, 39, 10000));
        assert!(weight(1000) > 9 * weight(100), "ten times the request, about ten times the weight");
    }

    #[test]
    fn the_request_is_protected_and_only_a_max_is_a_cap() {
        let requested = Resources { cpu: Some(Millicores(500)), memory: Some(Bytes(256 << 20)), ..Default::default() };
        let v1 = legacy(&requested);
        assert_eq!(value(&v1, "memory.soft_limit_in_bytes"), (256u64 << 20).to_string());
        assert_eq!(value(&v1, "memory.limit_in_bytes"), "-1");
        assert_eq!((value(&v1, "cpu.shares"), value(&v1, "cpu.cfs_quota_us")), ("512", "-1"));
        assert_eq!(value(&v1, "pids.max"), "4096");
        let v2 = unified(&requested);
        assert_eq!((value(&v2, "memory.low"), value(&v2, "memory.max")), ("268435456", "max"));
        assert_eq!(value(&v2, "cpu.max"), "max 100000");

        let capped = Resources {
            memory_max: Some(Bytes(64 << 20)),
            cpu_max: Some(Millicores(250)),
            pids_max: Some(64),
            ..requested
        };
        let v1 = legacy(&capped);
        assert_eq!(value(&v1, "memory.limit_in_bytes"), "67108864");
        let swap: Vec<&str> =
            v1.iter().filter(|s| s.file == "memory.memsw.limit_in_bytes").map(|s| s.value.as_str()).collect();
        assert_eq!(swap, ["-1", "67108864"], "lifted, then set to the cap with it");
        assert_eq!(value(&v1, "cpu.cfs_quota_us"), "25000");
        assert_eq!(value(&v1, "pids.max"), "64");
        let v2 = unified(&capped);
        assert_eq!((value(&v2, "memory.max"), value(&v2, "cpu.max")), ("67108864", "25000 100000"));
        assert_eq!(value(&v2, "memory.swap.max"), "0");
        assert_eq!(value(&unified(&requested), "memory.swap.max"), "max");
    }
}
