//! herd's pure core: resource types, validation, state machines and decisions.
//!
//! Invariant: nothing in this crate performs IO, reads a clock or spawns a
//! task. Callers pass in the current time, fresh ids and observations; the
//! functions here decide. That is what makes every decision unit- and
//! property-testable, and what lets the server and the agent share them.

pub mod admission;
pub mod agent_link;
pub mod agent_report;
pub mod api;
pub mod app_plan;
pub mod authz;
pub mod backoff;
pub mod configmeta;
pub mod configuration;
pub mod descriptor;
pub mod disruption;
pub mod election;
pub mod eviction;
pub mod failover;
pub mod findings;
pub mod grant;
pub mod join;
pub mod journal;
pub mod kinds;
pub mod labels;
pub mod lifecycle;
pub mod member_check;
pub mod member_sync;
pub mod merge_patch;
pub mod meta;
pub mod migration;
pub mod node_health;
pub mod node_loss;
pub mod notifies;
pub mod objects_only;
pub mod operation;
pub mod outcomes;
pub mod placement;
pub mod quantity;
pub mod reconcile;
pub mod resource;
pub mod resources;
pub mod restart;
pub mod restarts;
pub mod role_leader;
pub mod role_sync;
pub mod roles;
pub mod selection;
pub mod setup_status;
pub mod switchover;
pub mod throttle;
pub mod time;
pub mod units;
pub mod upgrade;
pub mod upgrade_hooks;
pub mod usage;
pub mod validation;
pub mod verify;

pub use meta::ObjectMeta;
pub use resource::{Object, Resource};
pub use time::{HumanDuration, Timestamp};
pub use validation::{FieldError, FieldPath, ValidationErrors};

/// The `apiVersion` every herd object carries.
pub const API_VERSION: &str = "herd/v1";
