//! herd's integration tests, one binary: each module tests one area
//! through real `herd` processes on loopback (`common` starts and reaps
//! them). One binary links once and runs every test in one pool of
//! threads.

mod common;

mod api_features;
mod api_security;
mod app_clusters;
mod app_upgrades;
mod cli_habits;
mod command_failures;
mod commands;
mod config_replication;
mod copy_faults;
mod crash_durability;
mod dashboard;
mod dashboard_scale;
mod dev_mode;
mod disk_faults;
mod disruption_budgets;
mod drain;
mod election;
mod examples;
mod joining;
mod master_failover;
mod member_processes;
mod metrics;
mod node_lifecycle;
mod node_roles;
mod peer_grants;
mod postgres;
mod readme;
mod resources;
mod role_leaders;
mod shared_sqlite;
mod sim_nodes;
mod soak;
mod tls;
mod untrusted_input;
