//! [`EventRecorder`]: tells the operator what happened, as Event objects.
//! The same reason and message on the same object fold into one Event with
//! a count. Recording never fails the caller: a lost Event is logged.

use herd_core::kinds::{Event, EventReason, EventSpec, EventType, InvolvedObject};
use herd_core::{Object, Resource};

use crate::error::ApiError;
use crate::objects::{Objects, ObjectsError, Part, now};

#[derive(Clone)]
pub struct EventRecorder {
    objects: Objects,
    source: &'static str,
}

/// Event names are stable per (object, reason, message), so repeats fold.
fn event_name(involved: &InvolvedObject, reason: EventReason, message: &str) -> String {
    let digest = blake3::hash(format!("{reason}\n{message}").as_bytes()).to_hex();
    format!("{}.{}.{}", involved.kind.to_ascii_lowercase(), involved.name, &digest[..12])
}

impl EventRecorder {
    pub fn new(objects: Objects, source: &'static str) -> Self {
        EventRecorder { objects, source }
    }

    pub async fn record<S: Resource>(
        &self,
        object: &Object<S>,
        type_: EventType,
        reason: EventReason,
        message: String,
    ) {
        let involved = InvolvedObject {
            kind: S::KIND.to_string(),
            name: object.metadata.name.clone(),
            uid: object.metadata.uid.clone(),
        };
        self.record_about(involved, type_, reason, message).await
    }

    /// Records an Event about an object that need not exist (any more): a
    /// deleted node, a refused join under a name.
    pub async fn record_about(&self, involved: InvolvedObject, type_: EventType, reason: EventReason, message: String) {
        match type_ {
            EventType::Normal => {
                tracing::info!(object = %involved.name, kind = %involved.kind, reason = reason.as_str(), %message, "event")
            }
            EventType::Warning => {
                tracing::warn!(object = %involved.name, kind = %involved.kind, reason = reason.as_str(), %message, "event")
            }
        }
        if let Err(error) = self.write(involved, type_, reason, message).await {
            tracing::warn!(%error, reason = reason.as_str(), "could not record an event");
        }
    }

    async fn write(
        &self,
        involved: InvolvedObject,
        type_: EventType,
        reason: EventReason,
        message: String,
    ) -> Result<(), ApiError> {
        let name = event_name(&involved, reason, &message);
        let at = now();
        // Created first: most Events are new, and a repeat costs one refused
        // create before its count goes up.
        for _ in 0..3 {
            let event = Event::new(
                name.clone(),
                EventSpec {
                    type_,
                    reason: reason.to_string(),
                    message: message.clone(),
                    involved_object: involved.clone(),
                    source: self.source.to_string(),
                    count: 1,
                    first_timestamp: at,
                    last_timestamp: at,
                },
            );
            match self.objects.create(event, false, false).await {
                Err(ObjectsError::AlreadyExists { .. }) => {}
                other => return other.map(|_| ()).map_err(ApiError::from),
            }
            let bumped = self.objects.modify::<EventSpec, ApiError>(&name, Part::Spec, |event| {
                event.spec.count += 1;
                event.spec.last_timestamp = at;
                Ok(true)
            });
            match bumped.await {
                // Deleted meanwhile (its time was up): made again.
                Err(ApiError::NotFound { .. }) => continue,
                other => return other.map(|_| ()),
            }
        }
        Err(ApiError::Conflict(format!("event {name} kept changing")))
    }
}
