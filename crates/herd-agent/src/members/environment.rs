//! What a member's processes are given: one environment of herd's making
//! for all of them (its own, its setup, scripts, checks, drain hook), with
//! nothing of the agent's but PATH, HOME and LANG, a process group of
//! their own, and the member's cgroup.

use std::process::Stdio;

use herd_core::kinds::command::DrainHook;

use super::volumes::volume_env;
use super::{DEFAULT_PATH, MemberRecord, Members};
use crate::procs::{self, RunMark};

impl Members {
    /// `program` in the member's environment and nothing of the agent's:
    /// its directory, the role's variables, herd's member variables
    /// ([`Self::member_env`]), `HERD_INSTANCE_ID` (`instance`, else the
    /// run's), and of the agent's own only `PATH`, `HOME` and `LANG`, so
    /// that no herd credential (a join or admin token, the server, the
    /// CA) reaches a member, its setup, scripts or checks. In a process
    /// group of its own: signals reach all its processes, and none reach
    /// it from the agent's terminal. In the member's cgroup, when it has
    /// one. Standard input is empty.
    pub fn command(
        &self,
        record: &MemberRecord,
        program: impl AsRef<std::ffi::OsStr>,
        instance: Option<&str>,
    ) -> tokio::process::Command {
        let mut command = tokio::process::Command::new(program);
        command.env_clear();
        for key in ["PATH", "HOME", "LANG"] {
            if let Some(value) = std::env::var_os(key) {
                command.env(key, value);
            }
        }
        if std::env::var_os("PATH").is_none() {
            command.env("PATH", DEFAULT_PATH);
        }
        command.envs(&record.run.env).envs(self.member_env(record));
        if let Some(instance) = instance.or(record.process.as_ref().map(|p| p.instance_id.as_str())) {
            command.env("HERD_INSTANCE_ID", instance);
        }
        command.current_dir(self.member_dir(&record.name)).stdin(Stdio::null()).process_group(0);
        if let Some(cgroup) = &record.cgroup {
            cgroup.join_on_exec(&mut command);
        }
        command
    }

    /// `sh -c <script> <args>` in the member's environment (see
    /// [`Self::command`]), marked as one run, its output piped: a
    /// RunScript, a drain hook.
    pub fn shell(&self, record: &MemberRecord, script: &str, args: &[&str], mark: &RunMark) -> tokio::process::Command {
        let mut command = self.command(record, "sh", None);
        command.arg("-c").arg(script).args(args).env(procs::RUN_VAR, mark.as_str());
        command.stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
        command
    }

    /// Runs the member's drain hook (`sh -c <script> herd-drain --drain`,
    /// in its environment) for at most its timeout; what it says is logged.
    /// Whatever it started ends with it.
    pub(super) async fn drain_hook(&self, record: &MemberRecord, hook: &DrainHook) {
        // The member is stopped afterwards whatever the hook did.
        let _ = self.hook(record, hook, "drain", &[]).await;
    }

    /// Runs one of the member's hooks (`sh -c <script> herd-<name>
    /// --<name>`, in its environment and with `env` besides) for at most
    /// its timeout; what it says is logged. Whatever it started ends with
    /// it. Ok when it exited 0; else why not, with the end of its stderr.
    pub(super) async fn hook(
        &self,
        record: &MemberRecord,
        hook: &DrainHook,
        name: &str,
        env: &[(&str, String)],
    ) -> Result<(), String> {
        let member = &record.name;
        let mark = RunMark::fresh(name);
        let (program, flag) = (format!("herd-{name}"), format!("--{name}"));
        let mut command = self.shell(record, &hook.script, &[&program, &flag], &mark);
        command.envs(env.iter().map(|(key, value)| (*key, value)));
        let child = match command.spawn() {
            Ok(child) => child,
            Err(error) => {
                tracing::warn!(member, hook = name, %error, "could not start the hook");
                return Err(format!("could not start its {name} hook: {error}"));
            }
        };
        let pid = child.id().unwrap_or_default();
        let outcome = match tokio::time::timeout(hook.timeout.get(), child.wait_with_output()).await {
            Ok(Ok(output)) => {
                let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
                tracing::info!(member, hook = name, status = %output.status, %stderr, "hook ran");
                match output.status.success() {
                    true => Ok(()),
                    false => {
                        let tail: String =
                            stderr.chars().rev().take(500).collect::<Vec<_>>().into_iter().rev().collect();
                        Err(format!("its {name} hook ended with {}: {tail}", output.status))
                    }
                }
            }
            Ok(Err(error)) => {
                tracing::warn!(member, hook = name, %error, "the hook failed");
                Err(format!("its {name} hook failed: {error}"))
            }
            Err(_) => {
                tracing::warn!(member, hook = name, timeout = %hook.timeout, "the hook ran out of time");
                Err(format!("its {name} hook ran out of time ({})", hook.timeout))
            }
        };
        procs::end_run(Some(pid), &mark);
        outcome
    }

    /// What herd adds to a member's environment (for its process, its
    /// scripts and its checks): `HERD_MEMBER`, `HERD_VOLUME_<NAME>` to the
    /// path of each of its volumes, `HERD_CONFIGMETA` when it is an
    /// app-cluster member (and `HERD_CONFIGMETA_SH`, the same as shell
    /// variables), and `HERD_LEADER_TERM` while it leads its role (a
    /// process started, or started again, within its lease; `leader.json`
    /// says it at every moment).
    pub fn member_env(&self, record: &MemberRecord) -> Vec<(String, std::ffi::OsString)> {
        let mut env = vec![("HERD_MEMBER".to_string(), record.name.clone().into())];
        for volume in &record.run.volumes {
            env.push((volume_env(&volume.name), self.volume_dir(&record.name, &volume.name).into()));
        }
        if let Some(dir) = crate::setup::herd_volume(self, record) {
            env.push(("HERD_CONFIGMETA".into(), dir.join(crate::setup::CONFIGMETA).into()));
            env.push(("HERD_CONFIGMETA_SH".into(), dir.join(crate::setup::CONFIGMETA_SH).into()));
        }
        if let Some(lead) = self.lead(&record.name).filter(|l| l.deadline > tokio::time::Instant::now()) {
            env.push(("HERD_LEADER_TERM".into(), lead.term.to_string().into()));
        }
        env
    }
}
