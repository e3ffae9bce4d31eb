//! One module per command; [`run`] dispatches.

mod app;
mod apply;
mod cluster;
mod command_wait;
mod describe;
mod failover;
mod get;
mod logs;
mod member;
mod metadata;
pub mod modes;
mod node;
mod operation;
mod token;
mod top;

use anyhow::Context;
use clap::CommandFactory;

use crate::cli::{
    AppClusterCommand, AppCommand, Cli, ClusterCommand, Command, CommandAction, MemberCommand, NodeCommand,
    OperationCommand, TokenCommand,
};
use crate::context;
use herd_core::api::LogStream;
use herd_core::join::TokenKind;
use herd_core::kinds::{OnDeadline, OperationAction};

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let conn = cli.conn;
    match cli.command {
        Command::Get { kind: None, .. } => {
            get::kinds();
            Ok(())
        }
        Command::Get { kind: Some(kind), name, selector, output, watch } => {
            let selector = selector.as_deref().unwrap_or("");
            let client = context::client(&conn)?;
            if watch {
                return get::watch(&client, &kind, name.as_deref(), selector, output).await;
            }
            get::get(&client, &kind, name.as_deref(), selector, output).await
        }
        Command::Version => {
            println!("client: herd {}", env!("CARGO_PKG_VERSION"));
            let status = context::client(&conn)?.cluster_status().await.context("asking the server its version")?;
            let answering = status.replicas.iter().find(|r| r.name == status.served_by);
            let version = answering.map_or("unknown", |r| r.version.as_str());
            println!("server: herd {version} (replica {})", status.served_by);
            Ok(())
        }
        Command::Describe { kind, name } => get::describe(&context::client(&conn)?, &kind, &name).await,
        Command::Top { what } => top::top(&context::client(&conn)?, what).await,
        Command::Events { for_object, output, watch } => {
            get::events(&context::client(&conn)?, for_object.as_deref(), output, watch).await
        }
        Command::Apply { file, dry_run } => apply::apply(&context::client(&conn)?, &file, dry_run).await,
        Command::Delete { kind, name, dry_run } => apply::delete(&context::client(&conn)?, &kind, &name, dry_run).await,
        Command::Label(args) => metadata::change(&context::client(&conn)?, metadata::Field::Labels, &args).await,
        Command::Annotate(args) => {
            metadata::change(&context::client(&conn)?, metadata::Field::Annotations, &args).await
        }
        Command::Logs { target, stderr, setup, bytes, follow } => {
            let stream = if setup {
                LogStream::Setup
            } else if stderr {
                LogStream::Stderr
            } else {
                LogStream::Stdout
            };
            logs::logs(&context::client(&conn)?, &target, stream, bytes, follow).await
        }
        Command::Commands { action } => {
            let client = context::client(&conn)?;
            let (name, command) = match action {
                CommandAction::Retry { name } => {
                    let command = client.retry_command(&name).await?;
                    (name, command)
                }
                CommandAction::Abandon { name, keep_staging } => {
                    let command = client.abandon_command(&name, keep_staging).await?;
                    (name, command)
                }
                CommandAction::Wait { name, timeout } => {
                    return command_wait::wait(&client, &name, timeout.get()).await;
                }
            };
            println!("command/{name}: {} ({})", command.status.state_by_management, command.status.reason);
            Ok(())
        }
        Command::Node { command: NodeCommand::Volumes { name, output } } => {
            node::volumes(&context::client(&conn)?, &name, output).await
        }
        Command::Node { command: NodeCommand::Modify { name, role, master_capable, auto_promote } } => {
            node::modify(&context::client(&conn)?, &name, role.map(Into::into), master_capable, auto_promote).await
        }
        Command::Node {
            command: NodeCommand::Drain { name, deadline, on_deadline, max_parallel, dry_run, detach },
        } => {
            let client = context::client(&conn)?;
            if dry_run {
                return operation::drain_dry_run(&client, &name).await;
            }
            let action = OperationAction::Drain { node: name.clone() };
            let limits = operation::Limits { deadline, on_deadline: on_deadline.into(), max_parallel };
            operation::start(&client, &format!("drain-{name}"), action, limits, detach).await
        }
        Command::AppCluster { command: AppClusterCommand::Wait { name, state: _, timeout } } => {
            operation::wait_configured(&context::client(&conn)?, &name, timeout.get()).await
        }
        Command::AppCluster {
            command: AppClusterCommand::Restart { name, role, canary, max_parallel, deadline, on_deadline, detach },
        } => {
            let client = context::client(&conn)?;
            let prefix = format!("restart-{name}-{role}");
            let action = OperationAction::Restart { cluster: name, role, canary };
            let limits = operation::Limits { deadline, on_deadline: on_deadline.into(), max_parallel };
            operation::start(&client, &prefix, action, limits, detach).await
        }
        Command::AppCluster { command: AppClusterCommand::Switchover { name, role, to, deadline, detach } } => {
            let client = context::client(&conn)?;
            let prefix = format!("switchover-{name}-{role}");
            let action = OperationAction::Switchover { cluster: name, role, to };
            let limits = operation::Limits { deadline: Some(deadline), on_deadline: OnDeadline::Fail, max_parallel: 1 };
            operation::start(&client, &prefix, action, limits, detach).await
        }
        Command::Node { command: NodeCommand::Undrain { name } } => {
            operation::undrain(&context::client(&conn)?, &name).await
        }
        Command::App { command: AppCommand::History { name } } => app::history(&context::client(&conn)?, &name).await,
        Command::Operation { command: OperationCommand::Cancel { name } } => {
            operation::cancel(&context::client(&conn)?, &name).await
        }
        Command::Operation { command: OperationCommand::Pause { name } } => {
            operation::pause(&context::client(&conn)?, &name, true).await
        }
        Command::Operation { command: OperationCommand::Resume { name } } => {
            operation::pause(&context::client(&conn)?, &name, false).await
        }
        Command::AppCluster { command: AppClusterCommand::Upgrade { name, asked, deadline, detach } } => {
            operation::upgrade(&context::client(&conn)?, &name, &asked, deadline, detach).await
        }
        Command::Node { command: NodeCommand::Readmit { name } } => {
            let readmitted = context::client(&conn)?.readmit_node(&name).await?;
            println!("node/{name} readmitted: {}", readmitted.message);
            Ok(())
        }
        Command::Token { command } => {
            let (client, trust) = context::client_trusting(&conn)?;
            match command {
                TokenCommand::Create { viewer, ttl, description } => {
                    let kind = if viewer { TokenKind::Viewer } else { TokenKind::Join };
                    token::create(&client, trust.as_ref(), kind, ttl, description).await
                }
                TokenCommand::List { output } => token::list(&client, output).await,
                TokenCommand::Delete { id } => {
                    client.delete_join_token(&id).await?;
                    println!("token/{id} deleted");
                    Ok(())
                }
            }
        }
        Command::Member { command: MemberCommand::Evict { name, dry_run } } => {
            let eviction = context::client(&conn)?.evict_member(&name, dry_run).await?;
            let note = if eviction.dry_run { " (dry run: nothing changed)" } else { "" };
            println!("member/{name}: {}{note}", eviction.message);
            Ok(())
        }
        Command::Member { command: MemberCommand::Replace { name, yes } } => {
            member::replace(&context::client(&conn)?, &name, yes).await
        }
        Command::Member { command: MemberCommand::SkipNotify { name, all } } => {
            member::skip_notify(&context::client(&conn)?, &name, all).await
        }
        Command::Cluster { command: ClusterCommand::Verify { output } } => {
            let code = cluster::verify(&context::client(&conn)?, output).await?;
            if code != 0 {
                std::process::exit(code);
            }
            Ok(())
        }
        Command::Cluster { command: ClusterCommand::MasterFailover(args) } => failover::master_failover(*args).await,
        Command::Cluster { command: ClusterCommand::Status { output } } => {
            cluster::status(&context::client(&conn)?, output).await
        }
        Command::Server(args) => modes::server(args).await,
        Command::Agent(args) => modes::agent(args, conn).await,
        Command::Dev(args) => crate::dev::run(args).await,
        Command::SimNodes(args) => modes::sim_nodes(args, conn).await,
        Command::AgentWorker { job } => {
            let code = herd_agent::worker::main(&job).await;
            std::process::exit(code)
        }
        Command::LogWriter { .. } => unreachable!("main runs the log writer without a runtime"),
        Command::Completion { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "herd", &mut std::io::stdout());
            Ok(())
        }
    }
}
