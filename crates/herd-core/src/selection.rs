//! Which watch event a change is, for a watcher with a label selector.
//!
//! Kubernetes semantics: an object that stops matching the selector is
//! DELETED for that watcher, one that starts matching is ADDED. The tracker
//! remembers which keys match. It is seeded with the keys matching when the
//! watch starts (at revision `seeded_at`); a watch may replay changes from
//! before that, and for those a change that does not match is reported as
//! DELETED even if the watcher may never have seen the object (a delete of
//! an unknown object is harmless to a client; a missed one is not).

use std::collections::HashSet;

use crate::api::WatchEventType;
use crate::labels::{LabelSelector, Labels};

/// One change to one key, as the store reports it.
#[derive(Clone, Copy, Debug)]
pub struct Change<'a> {
    pub key: &'a str,
    /// The labels after a put, or the last labels before a delete.
    pub labels: &'a Labels,
    pub revision: u64,
    pub kind: ChangeKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChangeKind {
    Created,
    Modified,
    Deleted,
}

pub struct SelectionTracker {
    selector: LabelSelector,
    matching: HashSet<String>,
    seeded_at: u64,
}

impl SelectionTracker {
    /// `matching` holds the keys matching `selector` at revision `seeded_at`.
    pub fn new(selector: LabelSelector, matching: HashSet<String>, seeded_at: u64) -> Self {
        SelectionTracker { selector, matching, seeded_at }
    }

    /// The event to send for `change`, if any.
    pub fn classify(&mut self, change: Change<'_>) -> Option<WatchEventType> {
        if self.selector.is_empty() {
            return Some(match change.kind {
                ChangeKind::Created => WatchEventType::Added,
                ChangeKind::Modified => WatchEventType::Modified,
                ChangeKind::Deleted => WatchEventType::Deleted,
            });
        }
        let matches = self.selector.matches(change.labels);
        // One lookup of the key for most events (those not selected): a
        // watch of one node's Commands sees every node's.
        match change.kind {
            ChangeKind::Deleted => {
                let was = self.matching.remove(change.key);
                (matches || was).then_some(WatchEventType::Deleted)
            }
            ChangeKind::Created | ChangeKind::Modified if matches => {
                let was = self.matching.contains(change.key);
                if !was {
                    self.matching.insert(change.key.to_string());
                }
                let new_to_watcher = change.kind == ChangeKind::Created || (!was && change.revision > self.seeded_at);
                Some(if new_to_watcher { WatchEventType::Added } else { WatchEventType::Modified })
            }
            ChangeKind::Created | ChangeKind::Modified => {
                let was = self.matching.remove(change.key);
                (was || change.revision <= self.seeded_at).then_some(WatchEventType::Deleted)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(team: &str) -> Labels {
        [("team".to_string(), team.to_string())].into()
    }

    fn put(
        tracker: &mut SelectionTracker,
        key: &str,
        team: &str,
        revision: u64,
        created: bool,
    ) -> Option<WatchEventType> {
        let kind = if created { ChangeKind::Created } else { ChangeKind::Modified };
        tracker.classify(Change { key, labels: &labels(team), revision, kind })
    }

    #[test]
    fn objects_entering_and_leaving_the_selector() {
        let mut t = SelectionTracker::new(LabelSelector::parse("team=a").unwrap(), HashSet::new(), 10);
        assert_eq!(put(&mut t, "/x", "a", 11, true), Some(WatchEventType::Added));
        assert_eq!(put(&mut t, "/x", "a", 12, false), Some(WatchEventType::Modified));
        assert_eq!(put(&mut t, "/x", "b", 13, false), Some(WatchEventType::Deleted));
        assert_eq!(put(&mut t, "/x", "b", 14, false), None, "changes outside the selector are not sent");
        assert_eq!(put(&mut t, "/x", "a", 15, false), Some(WatchEventType::Added));
        let gone = t.classify(Change { key: "/x", labels: &labels("a"), revision: 16, kind: ChangeKind::Deleted });
        assert_eq!(gone, Some(WatchEventType::Deleted));
        assert_eq!(put(&mut t, "/y", "b", 17, true), None);
    }

    #[test]
    fn replayed_changes_before_the_seed_err_towards_deleted() {
        // /x matched when the client listed, then left the selector before the
        // watch was seeded: the tracker does not know it, and still says DELETED.
        let mut t = SelectionTracker::new(LabelSelector::parse("team=a").unwrap(), HashSet::new(), 10);
        assert_eq!(put(&mut t, "/x", "b", 9, false), Some(WatchEventType::Deleted));
        assert_eq!(put(&mut t, "/x", "b", 11, false), None);
    }

    #[test]
    fn without_a_selector_every_change_is_sent() {
        let mut t = SelectionTracker::new(LabelSelector::default(), HashSet::new(), 0);
        assert_eq!(put(&mut t, "/x", "b", 1, true), Some(WatchEventType::Added));
        assert_eq!(put(&mut t, "/x", "b", 2, false), Some(WatchEventType::Modified));
    }
}
