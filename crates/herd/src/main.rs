//! The `herd` binary: the CLI, and the `server`, `agent` and `dev` modes.
//!
//! Exit codes (scripts may rely on them): 0 success, 1 error, 2 usage
//! error, 3 not found, 4 conflict (already exists, or changed meanwhile).

mod cli;
mod commands;
mod context;
mod dev;
mod jsonpath;
mod kinds;
mod manifest_lines;
mod output;
mod processes;
mod tokens;

use std::process::ExitCode;

use clap::Parser;
use herd_client::ClientError;
use herd_core::api::StatusReason;

/// mimalloc rather than glibc's malloc: the server makes and drops many
/// small objects from many threads (JSON values, store rows, requests), and
/// under a burst glibc's arenas spent a fifth of its time in malloc and
/// free (consolidating and unlinking chunks); see docs/BENCHMARKS.md.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A command given wrongly (an unknown kind, a malformed argument): exit
/// code 2, as clap's own usage errors.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Usage(pub String);

/// What the CLI was asked cannot be done in the state things are in (an
/// Operation that ended cannot be cancelled): exit code 4, as the
/// server's conflicts.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Conflict(pub String);

fn exit_code(error: &anyhow::Error) -> u8 {
    if let Some(herd_server::ServerError::Settings(_)) = error.downcast_ref() {
        return 2;
    }
    if error.downcast_ref::<Usage>().is_some() {
        return 2;
    }
    if error.downcast_ref::<Conflict>().is_some() {
        return 4;
    }
    match error.downcast_ref::<ClientError>().and_then(ClientError::reason) {
        Some(StatusReason::NotFound) => 3,
        Some(StatusReason::Conflict | StatusReason::AlreadyExists | StatusReason::TooManyRequests) => 4,
        _ => 1,
    }
}

fn init_logging(verbose: bool, json: bool) {
    let default = if verbose { "debug" } else { "info" };
    let filter = tracing_subscriber::EnvFilter::try_from_env("HERD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    // Colour only for a person at a terminal: none in files, pipes or CI logs.
    use std::io::IsTerminal;
    let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
}

/// The most threads a server (`herd server`, and the one `herd dev` runs
/// in its own process) runs blocking work on. That work is its SQLite
/// store's: the writer and at most 8 readers at a time. With
/// tokio's default (512), a burst left some fifty threads, each keeping a
/// heap of its own: 150 MB more resident, and the server's CPU spent on
/// fresh pages (see docs/BENCHMARKS.md).
const SERVER_BLOCKING_THREADS: usize = 16;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    if let cli::Command::LogWriter { path, max_size, keep } = &args.command {
        return log_writer(path, herd_core::kinds::member_run::LogRotation { max_size: *max_size, keep: *keep });
    }
    let long_running = matches!(
        args.command,
        cli::Command::Server(_)
            | cli::Command::Agent(_)
            | cli::Command::Dev(_)
            | cli::Command::SimNodes(_)
            | cli::Command::AgentWorker { .. }
            | cli::Command::Cluster { command: cli::ClusterCommand::MasterFailover(_) }
    );
    if !long_running {
        // A CLI command dies quietly when stdout is a closed pipe (`herd
        // get ... | head`), as other tools do, instead of panicking on the
        // write. (Servers keep SIGPIPE ignored: a client hanging up must
        // not kill them.)
        // SAFETY: setting a signal disposition before any thread starts.
        unsafe {
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        }
    }
    init_logging(args.verbose, args.log_json);
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if matches!(args.command, cli::Command::Server(_) | cli::Command::Dev(_)) {
        builder.max_blocking_threads(SERVER_BLOCKING_THREADS);
    }
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: starting the async runtime: {error}");
            return ExitCode::from(1);
        }
    };
    match runtime.block_on(commands::run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(exit_code(&error))
        }
    }
}

/// `herd log-writer`: no runtime, one thread. It outlives the member's
/// stop signals (ignored: it ends when the last writer of its pipe has,
/// with everything said written), and a gone agent.
fn log_writer(path: &std::path::Path, rotation: herd_core::kinds::member_run::LogRotation) -> ExitCode {
    // SAFETY: setting signal dispositions before any thread starts.
    unsafe {
        for signal in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::signal(signal, libc::SIG_IGN);
        }
    }
    match herd_agent::member_logs::write_rotated(path, &rotation, std::io::stdin().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: writing {}: {error}", path.display());
            ExitCode::from(1)
        }
    }
}
