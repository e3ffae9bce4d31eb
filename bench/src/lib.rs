//! The parts of herd's benchmarks and soak that are worth testing on their
//! own: the linearizability checker the soak's clients' histories go
//! through, and the seeded schedule of its faults.

pub mod linearizable;
pub mod schedule;
