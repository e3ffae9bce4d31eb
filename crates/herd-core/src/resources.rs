//! What a member asks of its node and may use at most ([`Resources`], a
//! role's `resources`), and what a node offers ([`Amounts`]: its
//! capacity, what its agent keeps back, what is left to members).
//!
//! Requests are what placement counts: a node never has more requested
//! of it than it has allocatable. Limits are what the kernel enforces on
//! the member's cgroup. By default a member's memory request is protected,
//! not capped (page cache counted against a hard cap kills databases:
//! nomad#25939); a role asks for a cap with `memoryMax`.

use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::quantity::{Bytes, Millicores};
use crate::validation::{FieldPath, ValidationErrors};

/// A role's requests and limits.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Resources {
    /// CPU the member is counted to use: placement reserves it, and the
    /// member's CPU weight is in proportion to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu: Option<Millicores>,
    /// Memory placement reserves and the kernel protects from reclaim.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<Bytes>,
    /// Disk placement reserves for the member's volumes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk: Option<Bytes>,
    /// A hard memory cap: over it the kernel kills the member (none by
    /// default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_max: Option<Bytes>,
    /// A hard CPU cap (none by default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_max: Option<Millicores>,
    /// The most processes and threads the member may have [default: 4096].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u32>,
}

/// The pids limit of a member whose role sets none: a fork bomb stops
/// there, a database's connections do not.
pub const DEFAULT_PIDS_MAX: u32 = 4096;

/// The smallest CPU cap: a slice of 1 ms in every 100 ms period.
pub const MIN_CPU_MAX: Millicores = Millicores(10);

impl Resources {
    pub fn is_empty(&self) -> bool {
        *self == Resources::default()
    }

    /// What placement counts the member as taking of its node.
    pub fn requests(&self) -> Amounts {
        Amounts {
            cpu: self.cpu.unwrap_or_default(),
            memory: self.memory.unwrap_or_default(),
            disk: self.disk.unwrap_or_default(),
        }
    }

    pub fn pids_max(&self) -> u32 {
        self.pids_max.unwrap_or(DEFAULT_PIDS_MAX)
    }

    pub fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if let (Some(max), Some(request)) = (self.memory_max, self.memory)
            && max < request
        {
            errors.add(
                &path.child("memoryMax"),
                format!("{max} is less than the memory request ({request}): a cap must leave room for the request"),
            );
        }
        if let Some(max) = self.cpu_max {
            if max < MIN_CPU_MAX {
                errors.add(&path.child("cpuMax"), format!("{max} is less than the smallest cap, {MIN_CPU_MAX}"));
            } else if let Some(request) = self.cpu
                && max < request
            {
                errors.add(
                    &path.child("cpuMax"),
                    format!("{max} is less than the cpu request ({request}): a cap must leave room for the request"),
                );
            }
        }
        if self.pids_max == Some(0) {
            errors.add(&path.child("pidsMax"), "must be at least 1: the member is a process");
        }
    }
}

/// CPU, memory and disk: what a member requests, or what a node has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Amounts {
    #[serde(default)]
    pub cpu: Millicores,
    #[serde(default)]
    pub memory: Bytes,
    #[serde(default)]
    pub disk: Bytes,
}

/// One of the resources placement counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Cpu,
    Memory,
    Disk,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Cpu, Kind::Memory, Kind::Disk];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Cpu => "cpu",
            Kind::Memory => "memory",
            Kind::Disk => "disk",
        }
    }

    /// An amount of this resource for people: `1500m`, `3.5Gi`.
    pub fn show(self, value: u64) -> String {
        match self {
            Kind::Cpu => Millicores(value).to_string(),
            Kind::Memory | Kind::Disk => Bytes(value).approximate(),
        }
    }
}

/// A request that does not fit what a node has left: which resource, and
/// the figures a refusal names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    pub kind: Kind,
    pub requested: u64,
    pub left: u64,
    pub allocatable: u64,
}

impl fmt::Display for Shortfall {
    /// `memory 3.5Gi requested, 1.2Gi of 8Gi allocatable left`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let show = |value: u64| self.kind.show(value);
        write!(
            f,
            "{} {} requested, {} of {} allocatable left",
            self.kind.name(),
            show(self.requested),
            show(self.left),
            show(self.allocatable)
        )
    }
}

impl Amounts {
    pub fn get(&self, kind: Kind) -> u64 {
        match kind {
            Kind::Cpu => self.cpu.0,
            Kind::Memory => self.memory.0,
            Kind::Disk => self.disk.0,
        }
    }

    fn from_fn(mut value: impl FnMut(Kind) -> u64) -> Amounts {
        Amounts {
            cpu: Millicores(value(Kind::Cpu)),
            memory: Bytes(value(Kind::Memory)),
            disk: Bytes(value(Kind::Disk)),
        }
    }

    pub fn is_zero(&self) -> bool {
        *self == Amounts::default()
    }

    /// Both together (saturating: no node has 16 EiB to give).
    pub fn plus(&self, other: &Amounts) -> Amounts {
        Amounts::from_fn(|kind| self.get(kind).saturating_add(other.get(kind)))
    }

    /// What is left of `self` once `other` is taken (none below zero).
    pub fn minus(&self, other: &Amounts) -> Amounts {
        Amounts::from_fn(|kind| self.get(kind).saturating_sub(other.get(kind)))
    }

    /// The first resource of which `request` is more than what is left of
    /// `allocatable` once `taken` is counted; None when it fits. A
    /// resource not requested always fits.
    pub fn shortfall(allocatable: &Amounts, taken: &Amounts, request: &Amounts) -> Option<Shortfall> {
        let left = allocatable.minus(taken);
        Kind::ALL.into_iter().find(|kind| request.get(*kind) > left.get(*kind)).map(|kind| Shortfall {
            kind,
            requested: request.get(kind),
            left: left.get(kind),
            allocatable: allocatable.get(kind),
        })
    }
}

impl fmt::Display for Amounts {
    /// `cpu 2, memory 7.5Gi, disk 40Gi`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpu {}, memory {}, disk {}", self.cpu, self.memory.approximate(), self.disk.approximate())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn amounts(cpu: u64, memory: u64, disk: u64) -> Amounts {
        Amounts { cpu: Millicores(cpu), memory: Bytes(memory), disk: Bytes(disk) }
    }

    const GI: u64 = 1 << 30;

    #[test]
    fn a_shortfall_names_the_resource_and_what_is_left() {
        let allocatable = amounts(2000, 8 * GI, 100 * GI);
        let taken = amounts(500, 8 * GI - GI * 12 / 10, 0);
        let request = amounts(1000, GI * 7 / 2, 0);
        let short = Amounts::shortfall(&allocatable, &taken, &request).unwrap();
        assert_eq!(short.to_string(), "memory 3.5Gi requested, 1.2Gi of 8Gi allocatable left");
        let cpu = Amounts::shortfall(&allocatable, &taken, &amounts(1600, 0, 0)).unwrap();
        assert_eq!(cpu.to_string(), "cpu 1600m requested, 1500m of 2 allocatable left");
        assert_eq!(Amounts::shortfall(&allocatable, &taken, &amounts(1500, 0, 100 * GI)), None, "exactly what is left");
        assert_eq!(Amounts::shortfall(&amounts(0, 0, 0), &taken, &Amounts::default()), None, "nothing asked");
    }

    #[test]
    fn limits_under_requests_are_named_by_their_field() {
        let resources = Resources {
            cpu: Some(Millicores(500)),
            memory: Some(Bytes(GI)),
            memory_max: Some(Bytes(GI / 2)),
            cpu_max: Some(Millicores(250)),
            pids_max: Some(0),
            ..Default::default()
        };
        let mut errors = ValidationErrors::default();
        resources.validate(&FieldPath::root("resources"), &mut errors);
        let fields: Vec<&str> = errors.errors.iter().map(|e| e.field.as_str()).collect();
        assert_eq!(fields, ["resources.memoryMax", "resources.cpuMax", "resources.pidsMax"]);
        assert!(errors.errors[0].reason.contains("512Mi is less than the memory request (1Gi)"), "{errors}");
        let tiny = Resources { cpu_max: Some(Millicores(5)), ..Default::default() };
        let mut errors = ValidationErrors::default();
        tiny.validate(&FieldPath::root("resources"), &mut errors);
        assert_eq!(errors.errors[0].reason, "5m is less than the smallest cap, 10m");
    }

    #[test]
    fn requests_default_to_nothing_and_read_from_yaml_numbers_or_text() {
        let resources: Resources = serde_json::from_value(serde_json::json!({"cpu": 0.5, "memory": "512Mi"})).unwrap();
        assert_eq!(resources.requests(), amounts(500, 512 << 20, 0));
        assert_eq!(resources.pids_max(), DEFAULT_PIDS_MAX);
        assert!(Resources::default().requests().is_zero());
    }

    proptest! {
        /// Whatever fits, taken, never leaves more taken than allocatable.
        #[test]
        fn what_fits_never_overcommits(
            allocatable in (0u64..8000, 0u64..1 << 34, 0u64..1 << 40),
            requests in proptest::collection::vec((0u64..3000, 0u64..1 << 33, 0u64..1 << 38), 0..20),
        ) {
            let allocatable = amounts(allocatable.0, allocatable.1, allocatable.2);
            let mut taken = Amounts::default();
            for (cpu, memory, disk) in requests {
                let request = amounts(cpu, memory, disk);
                if Amounts::shortfall(&allocatable, &taken, &request).is_none() {
                    taken = taken.plus(&request);
                }
                for kind in Kind::ALL {
                    prop_assert!(taken.get(kind) <= allocatable.get(kind));
                }
            }
        }
    }
}
