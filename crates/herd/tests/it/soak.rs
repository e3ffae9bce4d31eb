//! The chaos soak (`herd_bench::soak`, `bench/src/soak/`) in short: a
//! hundred faults done, several at once, to the etcd example and the
//! PostgreSQL example (a leader role under a write probe) under three
//! server replicas on PostgreSQL (SQLite, said loudly, where no database
//! is given outside CI), with the first host in a network namespace to be
//! cut off, each host's data dir a tmpfs to be filled, and replicas'
//! clocks skewed; a violation of any invariant
//! fails the test, printing the seed that replays its schedule
//! (`SOAK_SEED=... cargo test soak`).

use std::time::Duration;

use herd_bench::schedule::Plan;
use herd_bench::soak::{Options, faketime_library, run};

use crate::common::apps::{member_port_block, require};

#[tokio::test(flavor = "multi_thread")]
async fn a_hundred_random_faults_break_no_invariant() {
    require(&["etcd", "etcdctl", "psql", herd_bench::soak::POSTGRES_SERVER]);
    let postgres = std::env::var("HERD_TEST_POSTGRES_URL").ok();
    match (&postgres, std::env::var_os("CI")) {
        (None, Some(_)) => panic!("HERD_TEST_POSTGRES_URL is not set: CI must run the soak on PostgreSQL"),
        (None, None) => eprintln!("!!! HERD_TEST_POSTGRES_URL is not set: the soak's replicas share SQLite instead"),
        _ => {}
    }
    let faketime = faketime_library();
    assert!(faketime.is_some() || std::env::var_os("CI").is_none(), "libfaketime is missing: .ci/run installs it");
    let seed = match std::env::var("SOAK_SEED") {
        Ok(seed) => seed.parse().expect("SOAK_SEED: a number"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    };
    let mut options = Options {
        plan: Plan {
            seed,
            kinds: Vec::new(),
            gap: (Duration::from_millis(500), Duration::from_millis(2000)),
            length: (Duration::from_millis(500), Duration::from_millis(4000)),
        },
        faults: 100,
        herd: env!("CARGO_BIN_EXE_herd").into(),
        replicas: 3,
        postgres,
        member_ports: Some(member_port_block()),
        // CI runs as root: the first host is cut off too.
        netns: true,
        faketime,
        disks: true,
        postgres_app: true,
        // Fewer operations than the long soak's 50 ms: a shorter check.
        client_pause: Duration::from_millis(100),
        keep_logs: false,
    };
    options.plan.kinds = options.possible();
    // It loads the machine as much as the PostgreSQL tests: it takes its
    // turn with them (beside the 20-failover test, that one failed).
    let _turn = crate::common::take_turn().await;
    let report = run(&options).await.unwrap_or_else(|violation| panic!("{violation:#}"));
    assert!(report.total_done() >= 100, "{report}");
    assert!(report.operations > 1000, "the clients worked all along: {report}");
    assert!(report.disruptions_checked > 0, "voluntary disruptions were granted and checked: {report}");
    assert!(report.issues_checked > 0, "Command issues were checked against the lease's term: {report}");
}
