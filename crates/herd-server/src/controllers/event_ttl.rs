//! Event expiry: Events older than an hour (since their last occurrence)
//! are deleted, as Kubernetes does, so that a flapping node cannot fill the
//! store with them. Safe on several replicas: each delete carries the
//! Event's resourceVersion, and a lost race is ignored.

use std::time::Duration;

use herd_core::kinds::{Event, EventSpec};
use herd_core::{Resource, Timestamp};
use tokio_util::sync::CancellationToken;

use crate::objects::{Objects, ObjectsError, now};

pub const EVENT_TTL: Duration = Duration::from_secs(3600);
const PASS_INTERVAL: Duration = Duration::from_secs(60);

/// The events whose last occurrence is older than `ttl` at `now`.
pub fn expired(events: &[Event], now: Timestamp, ttl: Duration) -> impl Iterator<Item = &Event> {
    events.iter().filter(move |e| e.spec.last_timestamp.age(now) > ttl)
}

pub async fn run(objects: Objects, stop: CancellationToken) {
    let mut ticks = tokio::time::interval(PASS_INTERVAL);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        if let Err(error) = pass(&objects).await {
            tracing::warn!(%error, "event expiry pass failed");
        }
    }
}

async fn pass(objects: &Objects) -> Result<(), ObjectsError> {
    let (events, _) = objects.list::<EventSpec>().await?;
    for event in expired(&events, now(), EVENT_TTL) {
        let revision = event
            .metadata
            .revision()
            .map_err(|e| ObjectsError::Corrupt { key: event.metadata.name.clone(), reason: e.to_string() })?;
        match objects.delete_value(EventSpec::KIND, EventSpec::PLURAL, &event.metadata.name, revision, false).await {
            Ok(_) | Err(ObjectsError::NotFound { .. } | ObjectsError::Conflict { .. }) => {}
            Err(other) => return Err(other),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::kinds::InvolvedObject;

    fn event(name: &str, last: &str) -> Event {
        let at = Timestamp::parse(last).unwrap();
        Event::new(
            name,
            EventSpec {
                reason: "R".into(),
                involved_object: InvolvedObject { kind: "Node".into(), name: "n".into(), uid: None },
                count: 1,
                first_timestamp: at,
                last_timestamp: at,
                ..Default::default()
            },
        )
    }

    #[test]
    fn only_events_past_the_ttl_expire() {
        let events = [event("old", "2026-11-29T10:00:00Z"), event("recent", "2026-11-29T10:30:00Z")];
        let now = Timestamp::parse("2026-11-29T11:10:00Z").unwrap();
        let names: Vec<_> = expired(&events, now, EVENT_TTL).map(|e| e.metadata.name.as_str()).collect();
        assert_eq!(names, ["old"]);
    }
}
