//! `Lease`: the record control-plane replicas elect a leader through.

use crate::descriptor::{Cell, Column};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::NoStatus;
use crate::resource::{Object, Resource};
use crate::time::Timestamp;
use crate::validation::{FieldPath, ValidationErrors};

pub type Lease = Object<LeaseSpec>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseSpec {
    /// Who holds the lease; empty means released, anyone may take it.
    #[serde(default)]
    pub holder_identity: String,
    pub lease_duration_seconds: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquire_time: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renew_time: Option<Timestamp>,
    /// How many times the holder changed.
    #[serde(default)]
    pub lease_transitions: u64,
    /// How a replica on the same store can tell that the holder's process
    /// died (a store-specific token): then it need not wait for expiry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder_liveness: Option<String>,
}

impl Resource for LeaseSpec {
    const KIND: &'static str = "Lease";
    const PLURAL: &'static str = "leases";
    const SHORT: &'static str = "lease";
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("HOLDER", Cell::Text { path: "/spec/holderIdentity" }),
        Column::of("DURATION", Cell::Seconds { path: "/spec/leaseDurationSeconds" }),
        Column::of("RENEWED", Cell::Age { path: "/spec/renewTime" }),
        Column::of("TRANSITIONS", Cell::Text { path: "/spec/leaseTransitions" }),
    ];
    const HAS_STATUS: bool = false;
    type Status = NoStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.lease_duration_seconds == 0 {
            errors.add(&path.child("leaseDurationSeconds"), "must be at least 1");
        }
    }
}
