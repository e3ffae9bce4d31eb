//! RunScript: a shell script run in a member's environment (its directory,
//! its environment variables and volumes), in a process group of its own;
//! what it started ends with it, and it is killed when the command's
//! deadline passes.

use std::time::SystemTime;

use herd_core::Timestamp;
use tokio::io::AsyncReadExt;

use crate::executor::Failure;
use crate::members::{MemberRecord, Members};
use crate::procs::{self, RunMark};

/// How much of each output stream the answer keeps (the end of it).
const OUTPUT_TAIL: usize = 16 * 1024;

pub struct ScriptOutcome {
    /// The exit code; -1 when a signal ended it.
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

fn tail(bytes: &[u8]) -> String {
    let start = bytes.len().saturating_sub(OUTPUT_TAIL);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}

pub async fn run(
    members: &Members,
    record: &MemberRecord,
    script: &str,
    deadline: Timestamp,
    started: impl FnOnce(Option<u32>, &RunMark),
) -> Result<ScriptOutcome, Failure> {
    let mark = RunMark::fresh("script");
    let mut child =
        members.shell(record, script, &[], &mark).spawn().map_err(|e| format!("starting the script: {e}"))?;
    let pid = child.id();
    started(pid, &mark);
    let (mut out, mut err) = (child.stdout.take(), child.stderr.take());
    let read = async {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        if let Some(out) = out.as_mut() {
            let _ = out.read_to_end(&mut stdout).await;
        }
        if let Some(err) = err.as_mut() {
            let _ = err.read_to_end(&mut stderr).await;
        }
        (stdout, stderr)
    };
    let left = deadline.system_time().duration_since(SystemTime::now()).unwrap_or_default();
    let finished = tokio::time::timeout(left, async {
        let (output, status) = tokio::join!(read, child.wait());
        (output, status)
    })
    .await;
    // Whatever the script started ends with it, and all of it at the deadline.
    procs::end_run(pid, &mark);
    match finished {
        Ok(((stdout, stderr), status)) => {
            let status = status.map_err(|e| format!("waiting for the script: {e}"))?;
            Ok(ScriptOutcome { code: status.code().unwrap_or(-1), stdout: tail(&stdout), stderr: tail(&stderr) })
        }
        Err(_) => Err("the script did not finish before the command's deadline; killed".into()),
    }
}
