//! The loop every controller runs (kube-rs's `Controller`, pared down):
//! wait until its caches are synced, then call `reconcile` again and again.
//! A pass says when to look again ([`Next`]; kube-rs's `Action`, renamed
//! here beside the Command kind's actions); a watched cache that
//! changes wakes it sooner; a failed pass is retried after the pause its
//! error policy gives (doubling by default). "Since when has this held"
//! is [`crate::change_clock::ChangeClock`], which controllers keep in
//! their state.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::select_all;
use herd_core::backoff::Backoff;
use herd_store::Revision;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;
use crate::objects::ObjectsError;

/// What a reconcile pass asks for next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Look again after this long (or sooner, when a trigger changes).
    Requeue(Duration),
}

/// The longest pause the default error policy waits.
pub const MAX_ERROR_PAUSE: Duration = Duration::from_secs(30);

/// A leader-only controller.
pub trait Controller: Send + 'static {
    /// For logs.
    const NAME: &'static str;

    /// The least time between the end of a pass and the start of the
    /// next that a trigger wakes (a requeue due sooner still runs): a
    /// burst of changes is one pass, not one each.
    const MIN_GAP: Duration = Duration::ZERO;

    /// Resolves once the caches it reads from are complete.
    fn synced(&self) -> impl Future<Output = ()> + Send;

    /// The changes that wake it before its requeue is due (none: it runs
    /// on its own schedule).
    fn triggers(&self) -> Vec<Trigger>;

    /// One pass over everything the controller owns.
    fn reconcile(&mut self) -> impl Future<Output = Result<Next, ObjectsError>> + Send;

    /// The pause after the `failures`-th failed pass in a row: 400 ms,
    /// doubling, at most [`MAX_ERROR_PAUSE`].
    fn error_policy(&self, _error: &ObjectsError, failures: u32) -> Duration {
        Backoff::new(Duration::from_millis(400), MAX_ERROR_PAUSE).pause(failures)
    }
}

/// A cache whose change wakes a controller before its requeue is due.
pub type Trigger = watch::Receiver<Option<Revision>>;

/// Runs `controller` until `stop` fires, woken by its triggers; each
/// pass's duration goes to `metrics`.
pub async fn run<C: Controller>(mut controller: C, metrics: Arc<Metrics>, stop: CancellationToken) {
    let mut triggers = controller.triggers();
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = controller.synced() => {}
    }
    let mut failures = 0;
    loop {
        let started = std::time::Instant::now();
        let pass = controller.reconcile().await;
        metrics.observe_reconcile(C::NAME, pass.is_err(), started.elapsed());
        let pause = match pass {
            Ok(Next::Requeue(after)) => {
                failures = 0;
                after
            }
            Err(error) => {
                failures += 1;
                tracing::warn!(controller = C::NAME, %error, failures, "reconcile pass failed");
                controller.error_policy(&error, failures)
            }
        };
        // Changes during the gap are kept by the triggers and wake it after.
        let woken = async {
            tokio::time::sleep(C::MIN_GAP).await;
            any_changed(&mut triggers).await
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
            _ = woken => {}
        }
    }
}

/// Resolves when any trigger changes (never, when there are none or all
/// their caches are gone).
async fn any_changed(triggers: &mut [Trigger]) {
    if triggers.is_empty() {
        return std::future::pending().await;
    }
    let (changed, _, _) = select_all(triggers.iter_mut().map(|t| Box::pin(t.changed()))).await;
    if changed.is_err() {
        std::future::pending::<()>().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// Fails its first two passes, then asks to be looked at hourly.
    struct Flaky {
        passes: Arc<AtomicU32>,
        trigger: Trigger,
    }

    impl Controller for Flaky {
        const NAME: &'static str = "flaky";

        async fn synced(&self) {}

        fn triggers(&self) -> Vec<Trigger> {
            vec![self.trigger.clone()]
        }

        async fn reconcile(&mut self) -> Result<Next, ObjectsError> {
            match self.passes.fetch_add(1, Ordering::SeqCst) {
                0 | 1 => Err(ObjectsError::Store(herd_store::StoreError::Closed)),
                _ => Ok(Next::Requeue(Duration::from_secs(3600))),
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_back_off_a_requeue_waits_and_a_trigger_wakes_it_early() {
        let passes = Arc::new(AtomicU32::new(0));
        let (tell, trigger) = watch::channel(None);
        let stop = CancellationToken::new();
        let dir = tempfile::tempdir().unwrap();
        let store = herd_store::Store::open(dir.path().join("s.db").to_str().unwrap()).await.unwrap();
        let metrics = Arc::new(Metrics::new(&store));
        let task = tokio::spawn(run(Flaky { passes: passes.clone(), trigger }, metrics.clone(), stop.clone()));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 1, "the first pass failed");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 2, "retried after 400 ms");
        tokio::time::sleep(Duration::from_millis(800)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 3, "retried after 800 ms, and succeeded");
        tokio::time::sleep(Duration::from_secs(600)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 3, "nothing until the requeue is due");
        tell.send_replace(Some(7));
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(passes.load(Ordering::SeqCst), 4, "a change of the watched cache wakes it");
        stop.cancel();
        task.await.unwrap();
        let counted = metrics.render();
        for line in [
            "herd_reconcile_duration_seconds_count{controller=\"flaky\",outcome=\"error\"} 2",
            "herd_reconcile_duration_seconds_count{controller=\"flaky\",outcome=\"ok\"} 2",
        ] {
            assert!(counted.lines().any(|l| l == line), "{line} in\n{counted}");
        }
    }
}
