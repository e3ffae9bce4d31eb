//! `Event`: something that happened to an object, told to the operator.
//! Repeats of the same reason and message on the same object are folded
//! into one Event with a count.

use crate::descriptor::{Cell, Column};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::NoStatus;
use crate::resource::{Object, Resource};
use crate::time::Timestamp;
use crate::validation::{FieldPath, ValidationErrors};

pub type Event = Object<EventSpec>;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum EventType {
    #[default]
    Normal,
    Warning,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct InvolvedObject {
    pub kind: String,
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EventSpec {
    #[serde(rename = "type", default)]
    pub type_: EventType,
    /// A short CamelCase word: `NodeNotReady`.
    pub reason: String,
    pub message: String,
    pub involved_object: InvolvedObject,
    /// Which part of herd reported it: `node-lifecycle`.
    #[serde(default)]
    pub source: String,
    pub count: u64,
    pub first_timestamp: Timestamp,
    pub last_timestamp: Timestamp,
}

impl EventSpec {
    /// Whether herd recorded it for `reason`.
    pub fn reason_is(&self, reason: super::EventReason) -> bool {
        self.reason == reason.as_str()
    }
}

impl Resource for EventSpec {
    const KIND: &'static str = "Event";
    const PLURAL: &'static str = "events";
    const SHORT: &'static str = "ev";
    const COLUMNS: &'static [Column] = &[
        Column::of("LAST SEEN", Cell::Age { path: "/spec/lastTimestamp" }),
        Column::of("TYPE", Cell::Text { path: "/spec/type" }),
        Column::of("REASON", Cell::Text { path: "/spec/reason" }),
        Column::of("OBJECT", Cell::EventObject),
        Column::of("COUNT", Cell::Text { path: "/spec/count" }),
        Column::of("MESSAGE", Cell::Text { path: "/spec/message" }),
        Column::wide("SOURCE", Cell::Text { path: "/spec/source" }),
        Column::wide("FIRST SEEN", Cell::Age { path: "/spec/firstTimestamp" }),
    ];
    const HAS_STATUS: bool = false;
    type Status = NoStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.reason.is_empty() || !self.reason.chars().all(|c| c.is_ascii_alphanumeric()) {
            errors.add(&path.child("reason"), "must be a non-empty CamelCase word");
        }
        if self.count == 0 {
            errors.add(&path.child("count"), "must be at least 1");
        }
        if self.involved_object.kind.is_empty() {
            errors.add(&path.child("involvedObject.kind"), "must not be empty");
        }
        if self.involved_object.name.is_empty() {
            errors.add(&path.child("involvedObject.name"), "must not be empty");
        }
        if self.last_timestamp < self.first_timestamp {
            errors.add(&path.child("lastTimestamp"), "must not be before firstTimestamp");
        }
    }
}
