//! The keyed runtime (kube-rs's `Controller`): a controller reconciles
//! one object at a time, by its key, and says when to look at it again
//! ([`Action`]). A scheduler runs each key at most once at a time, merges
//! wake-ups that come while a key waits or runs (it runs once more after),
//! backs off per key on errors, and runs at most
//! [`KeyedController::CONCURRENCY`] keys side by side. What wakes which
//! keys is declared once, beside the caches the controller reads
//! ([`Watches`]: the kind it owns, and the kinds it watches with a map
//! from a changed object to the keys it concerns), so a busy key never
//! holds up the others.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::{FuturesUnordered, SelectAll};
use herd_core::Resource;
use herd_core::backoff::Backoff;
use tokio::sync::broadcast::error::RecvError;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::objects::ObjectsError;
use crate::reflector::{Changed, Reflector};

/// What a reconcile of one key asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Look again after this long (or sooner, when something it watches
    /// changes).
    Requeue(Duration),
    /// Look again only when something it watches changes.
    AwaitChange,
}

/// The pauses after failed reconciles of one key in a row.
pub const ERROR_BACKOFF: Backoff = Backoff::new(Duration::from_millis(400), Duration::from_secs(30));

/// A leader-only controller that reconciles one object at a time.
pub trait KeyedController: Send + Sync + 'static {
    /// For logs and metrics.
    const NAME: &'static str;
    /// How many keys may be reconciled side by side: their writes meet
    /// in the store's group commits.
    const CONCURRENCY: usize = 32;

    /// Resolves once the caches it reads from are complete.
    fn synced(&self) -> impl Future<Output = ()> + Send;

    /// Every key there is now: each is reconciled at the start, and again
    /// when a cache it watches lists afresh.
    fn keys(&self) -> Vec<String>;

    /// One pass over the object of `key` (which may be gone).
    fn reconcile(&self, key: &str) -> impl Future<Output = Result<Action, ObjectsError>> + Send;
}

/// What a change wakes: some keys, or every key.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    Keys(Vec<String>),
    All,
}

/// The changes that wake a controller's keys, declared in one place.
#[derive(Default)]
pub struct Watches {
    sources: SelectAll<Pin<Box<dyn futures_util::Stream<Item = Wake> + Send>>>,
}

impl Watches {
    pub fn new() -> Self {
        Watches::default()
    }

    /// The kind the controller reconciles: a changed object wakes its own key.
    pub fn owns<S: Resource>(self, reflector: &Reflector<S>) -> Self {
        self.watches(reflector, |old, new| {
            let names = old.into_iter().chain(new).map(|o| o.metadata.name.clone());
            names.collect::<BTreeSet<_>>().into_iter().collect()
        })
    }

    /// Another kind: a changed object (as it was, and is) wakes the keys
    /// `keys` names.
    pub fn watches<S: Resource>(
        mut self,
        reflector: &Reflector<S>,
        keys: impl Fn(Option<&herd_core::Object<S>>, Option<&herd_core::Object<S>>) -> Vec<String> + Send + Sync + 'static,
    ) -> Self {
        let receiver = reflector.changed();
        let stream = futures_util::stream::unfold((receiver, keys), |(mut receiver, keys)| async move {
            let wake = match receiver.recv().await {
                Ok(changed) => match &*changed {
                    Changed::Relisted => Wake::All,
                    Changed::Entries(entries) => {
                        Wake::Keys(entries.iter().flat_map(|(old, new)| keys(old.as_deref(), new.as_deref())).collect())
                    }
                },
                // Fell behind: any key may have changed.
                Err(RecvError::Lagged(_)) => Wake::All,
                Err(RecvError::Closed) => return None,
            };
            Some((wake, (receiver, keys)))
        });
        self.sources.push(Box::pin(stream));
        self
    }

    /// Every key, whenever anything of this kind changes (a setting every
    /// object depends on).
    pub fn all_on<S: Resource>(mut self, reflector: &Reflector<S>) -> Self {
        let receiver = reflector.changed();
        let stream = futures_util::stream::unfold(receiver, |mut receiver| async move {
            match receiver.recv().await {
                Ok(_) | Err(RecvError::Lagged(_)) => Some((Wake::All, receiver)),
                Err(RecvError::Closed) => None,
            }
        });
        self.sources.push(Box::pin(stream));
        self
    }
}

/// When each key is due, which run, and which were woken while running.
#[derive(Default)]
struct Schedule {
    /// Each waiting key's due time (the earliest asked for).
    due: HashMap<String, Instant>,
    /// The same, by time.
    queue: BTreeMap<(Instant, String), ()>,
    running: BTreeSet<String>,
    /// Woken while running: run again once done.
    again: BTreeSet<String>,
    failures: HashMap<String, u32>,
}

impl Schedule {
    /// Asks for `key` to run at `at`, or sooner if already due sooner.
    fn at(&mut self, key: &str, at: Instant) {
        if self.running.contains(key) {
            self.again.insert(key.to_string());
            return;
        }
        match self.due.get(key) {
            Some(due) if *due <= at => {}
            Some(due) => {
                self.queue.remove(&(*due, key.to_string()));
                self.due.insert(key.to_string(), at);
                self.queue.insert((at, key.to_string()), ());
            }
            None => {
                self.due.insert(key.to_string(), at);
                self.queue.insert((at, key.to_string()), ());
            }
        }
    }

    /// The keys due at `now`, taken out, at most `room` of them.
    fn take_due(&mut self, now: Instant, room: usize) -> Vec<String> {
        let mut taken = Vec::new();
        while taken.len() < room {
            let Some(((at, key), ())) = self.queue.pop_first() else { break };
            if at > now {
                self.queue.insert((at, key), ());
                break;
            }
            self.due.remove(&key);
            self.running.insert(key.clone());
            taken.push(key);
        }
        taken
    }

    fn next_due(&self) -> Option<Instant> {
        self.queue.keys().next().map(|(at, _)| *at)
    }

    /// A reconcile of `key` ended at `now`: when it runs next.
    fn done(&mut self, key: String, outcome: &Result<Action, ObjectsError>, now: Instant) {
        self.running.remove(&key);
        let woken = self.again.remove(&key);
        let next = match outcome {
            Ok(action) => {
                self.failures.remove(&key);
                match action {
                    Action::Requeue(after) => Some(now + *after),
                    Action::AwaitChange => None,
                }
            }
            Err(_) => {
                let failures = self.failures.entry(key.clone()).or_default();
                *failures += 1;
                Some(now + ERROR_BACKOFF.pause(*failures))
            }
        };
        // A change while it ran is looked at at once, unless it just failed
        // (then it waits out its backoff).
        let next = match (woken, outcome.is_ok(), next) {
            (true, true, _) => Some(now),
            (_, _, next) => next,
        };
        if let Some(at) = next {
            self.at(&key, at);
        }
    }
}

type Running = Pin<Box<dyn Future<Output = (String, Result<Action, ObjectsError>, Duration)> + Send>>;

/// Runs `controller` until `stop` fires, its keys woken by `watches`;
/// each reconcile's duration goes to `metrics`. A lost leadership
/// (a fenced write) stops it at once.
pub async fn run<C: KeyedController>(
    controller: C,
    mut watches: Watches,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
) {
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = controller.synced() => {}
    }
    let controller = Arc::new(controller);
    let mut schedule = Schedule::default();
    let mut running: FuturesUnordered<Running> = FuturesUnordered::new();
    let start = Instant::now();
    for key in controller.keys() {
        schedule.at(&key, start);
    }
    loop {
        let now = Instant::now();
        for key in schedule.take_due(now, C::CONCURRENCY.saturating_sub(running.len())) {
            let controller = controller.clone();
            running.push(Box::pin(async move {
                let started = Instant::now();
                let outcome = controller.reconcile(&key).await;
                (key, outcome, started.elapsed())
            }));
        }
        let next_due = schedule.next_due().filter(|_| running.len() < C::CONCURRENCY);
        let sleep = async {
            match next_due {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            Some((key, outcome, took)) = running.next(), if !running.is_empty() => {
                metrics.observe_reconcile(C::NAME, outcome.is_err(), took);
                match &outcome {
                    Err(fenced @ ObjectsError::Fenced { .. }) => {
                        tracing::warn!(controller = C::NAME, %key, error = %fenced, "leadership lost");
                        return;
                    }
                    Err(error) => tracing::info!(controller = C::NAME, %key, %error, "reconcile to be done again"),
                    Ok(_) => {}
                }
                schedule.done(key, &outcome, Instant::now());
            }
            Some(wake) = watches.sources.next(), if !watches.sources.is_empty() => {
                let now = Instant::now();
                match wake {
                    Wake::Keys(keys) => keys.iter().for_each(|key| schedule.at(key, now)),
                    Wake::All => controller.keys().iter().for_each(|key| schedule.at(key, now)),
                }
            }
            _ = sleep => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    /// Records each reconcile; fails key "flaky" twice; "slow" takes a second.
    struct Recorder {
        runs: Arc<Mutex<Vec<(String, Duration)>>>,
        failures: Mutex<u32>,
        start: Instant,
    }

    impl KeyedController for Recorder {
        const NAME: &'static str = "recorder";
        const CONCURRENCY: usize = 2;

        async fn synced(&self) {}

        fn keys(&self) -> Vec<String> {
            vec!["quiet".into(), "flaky".into(), "slow".into()]
        }

        async fn reconcile(&self, key: &str) -> Result<Action, ObjectsError> {
            self.runs.lock().unwrap().push((key.to_string(), self.start.elapsed()));
            match key {
                "flaky" => {
                    let mut failures = self.failures.lock().unwrap();
                    *failures += 1;
                    if *failures <= 2 {
                        return Err(ObjectsError::Store(herd_store::StoreError::Closed));
                    }
                    Ok(Action::AwaitChange)
                }
                "slow" => {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    Ok(Action::Requeue(Duration::from_secs(60)))
                }
                _ => Ok(Action::Requeue(Duration::from_secs(10))),
            }
        }
    }

    fn runs_of(runs: &Mutex<Vec<(String, Duration)>>, key: &str) -> Vec<u64> {
        runs.lock().unwrap().iter().filter(|(k, _)| k == key).map(|(_, at)| at.as_millis() as u64).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn each_key_keeps_its_own_time_and_backoff_and_a_busy_one_holds_up_no_other() {
        let dir = tempfile::tempdir().unwrap();
        let store = herd_store::Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        let metrics = Arc::new(Metrics::new(&store));
        let runs = Arc::new(Mutex::new(Vec::new()));
        let start = Instant::now();
        let recorder = Recorder { runs: runs.clone(), failures: Mutex::new(0), start };
        let stop = CancellationToken::new();
        let task = tokio::spawn(run(recorder, Watches::new(), metrics.clone(), stop.clone()));
        tokio::time::sleep(Duration::from_millis(25_500)).await;
        assert_eq!(runs_of(&runs, "flaky"), [0, 400, 1_200], "retried after 400 ms, then 800 ms; then it waits");
        assert_eq!(runs_of(&runs, "slow"), [0], "once, then an hourly requeue");
        let quiet = runs_of(&runs, "quiet");
        assert_eq!(quiet.len(), 3, "every 10 s, whatever the slow key does: {quiet:?}");
        stop.cancel();
        task.await.unwrap();
        let counted = metrics.render();
        assert!(counted.contains("controller=\"recorder\",outcome=\"error\"} 2"), "{counted}");
    }

    #[test]
    fn a_key_woken_while_it_runs_runs_once_more_and_wakes_merge() {
        let now = Instant::now();
        let mut schedule = Schedule::default();
        schedule.at("a", now + Duration::from_secs(5));
        schedule.at("a", now);
        schedule.at("a", now + Duration::from_secs(1));
        assert_eq!(schedule.take_due(now, 10), ["a"], "one run for three wake-ups, at the earliest");
        schedule.at("a", now);
        schedule.at("a", now);
        assert!(schedule.take_due(now, 10).is_empty(), "not twice at once");
        schedule.done("a".into(), &Ok(Action::AwaitChange), now);
        assert_eq!(schedule.take_due(now, 10), ["a"], "once more, for the wake-ups while it ran");
        schedule.done("a".into(), &Ok(Action::AwaitChange), now);
        assert!(schedule.take_due(now + Duration::from_secs(3600), 10).is_empty(), "then it waits for a change");
    }

    #[tokio::test]
    async fn a_watched_change_wakes_the_keys_it_maps_to() {
        use herd_core::Object;
        use herd_core::kinds::{EventSpec, InvolvedObject};
        let dir = tempfile::tempdir().unwrap();
        let store = herd_store::Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        let objects = crate::objects::Objects::new(store.clone());
        let stop = CancellationToken::new();
        let events: Reflector<EventSpec> = Reflector::start(store.clone(), stop.clone());
        events.synced().await;
        let mut watches = Watches::new()
            .watches(&events, |_, new| new.map(|e| vec![e.spec.involved_object.name.clone()]).unwrap_or_default());
        let event = EventSpec {
            reason: "Test".into(),
            message: "m".into(),
            involved_object: InvolvedObject { kind: "Node".into(), name: "n7".into(), uid: None },
            count: 1,
            ..Default::default()
        };
        objects.create(Object::new("e1", event), false, false).await.unwrap();
        let woken = tokio::time::timeout(Duration::from_secs(5), watches.sources.next()).await.unwrap();
        assert_eq!(woken, Some(Wake::Keys(vec!["n7".into()])));
        stop.cancel();
    }
}
