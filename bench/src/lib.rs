//! What herd's benchmarks and soak share: the linearizability checker the
//! soak's clients' histories go through, the seeded schedule of its
//! faults, the PostgreSQL write probe, the soak itself (run by its binary and by the integration
//! tests), starting real `herd` processes, network namespaces, and a real
//! browser for the dashboard's test and benchmark.

pub mod browser;
pub mod linearizable;
pub mod netns;
pub mod probe;
pub mod processes;
pub mod schedule;
pub mod soak;
