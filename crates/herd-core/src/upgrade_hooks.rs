//! An upgrade's hooks: the `preUpgrade` and `postUpgrade` scripts of the
//! revision a member is restarted as (an upgrade, or its revert) run in
//! its setup, around `--configure`, once for the new instance (as the
//! setup itself runs once per instance), with `HERD_FROM_REVISION` and
//! `HERD_TO_REVISION` in their environment. Their output is the setup's
//! (`herd logs --setup`), and a hook that fails fails the setup: the
//! member is in config error, which stops an upgrade. Pure: the script
//! the setup runs is composed here.

use std::fmt::Write;
use std::time::Duration;

use crate::kinds::app::{SetupScript, UpgradeRules};
use crate::time::HumanDuration;

/// What a member's setup runs: its role's `setup` alone, or, for an
/// instance restarted from revision `from` to `to` whose App has upgrade
/// hooks, those around it. None: nothing to run.
pub fn setup_to_run(
    setup: Option<&SetupScript>,
    rules: &UpgradeRules,
    upgrade: Option<(i64, i64)>,
) -> Option<SetupScript> {
    let hooks = [("preUpgrade", rules.pre_upgrade.as_ref()), ("postUpgrade", rules.post_upgrade.as_ref())];
    let Some((from, to)) = upgrade.filter(|_| hooks.iter().any(|(_, h)| h.is_some())) else {
        return setup.cloned();
    };
    let mut script = format!("export HERD_FROM_REVISION={from} HERD_TO_REVISION={to}\n");
    let mut timeout = Duration::ZERO;
    let mut part = |name: &str, part: &SetupScript, args: &str| {
        timeout += part.timeout.get();
        // Each in a subshell of its own: its `exit` ends it alone, and
        // its last line may be a comment.
        let _ = write!(
            script,
            "echo \"herd: {name} (revision {from} to {to})\"\n(\n{args}{}\n)\ncode=$?\nif [ \"$code\" != 0 ]; then \
             echo \"herd: {name} failed (exit status $code)\" >&2; exit \"$code\"; fi\n",
            part.script
        );
    };
    if let (_, Some(pre)) = hooks[0] {
        part("preUpgrade", pre, "set --\n");
    }
    if let Some(setup) = setup {
        part("setup", setup, "");
    }
    if let (_, Some(post)) = hooks[1] {
        part("postUpgrade", post, "set --\n");
    }
    Some(SetupScript { script, timeout: HumanDuration(timeout) })
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;

    fn hook(script: &str) -> Option<SetupScript> {
        Some(SetupScript { script: script.into(), timeout: HumanDuration::from_secs(60) })
    }

    /// Runs `script` as the setup wrapper does (`sh setup.sh --configure`,
    /// here from `-c`): (exit code, stdout, stderr).
    fn run(script: &str) -> (i32, String, String) {
        let out = Command::new("sh").arg("-c").arg(script).arg("setup.sh").arg("--configure").output().unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    #[test]
    fn the_hooks_run_around_the_setup_with_the_revisions_and_a_failing_one_fails_it() {
        let setup = hook("echo \"setup $1\"; exit 0 # the setup's own exit");
        let rules = UpgradeRules {
            pre_upgrade: hook("echo \"pre $HERD_FROM_REVISION->$HERD_TO_REVISION args:$#\""),
            post_upgrade: hook("echo post\n# a last comment"),
            ..Default::default()
        };
        assert_eq!(setup_to_run(setup.as_ref(), &rules, None), setup, "not an upgrade: the setup alone");
        let composed = setup_to_run(setup.as_ref(), &rules, Some((1, 2))).unwrap();
        assert_eq!(composed.timeout, HumanDuration::from_secs(180));
        let (code, out, _) = run(&composed.script);
        assert_eq!(code, 0);
        let lines: Vec<&str> = out.lines().filter(|l| !l.starts_with("herd: ")).collect();
        assert_eq!(lines, ["pre 1->2 args:0", "setup --configure", "post"]);
        let failing = UpgradeRules { pre_upgrade: hook("echo migrating; exit 7"), ..rules };
        let (code, out, err) = run(&setup_to_run(setup.as_ref(), &failing, Some((1, 2))).unwrap().script);
        assert_eq!(code, 7);
        assert!(!out.contains("setup --configure"), "nothing after a failed hook: {out}");
        assert!(err.contains("herd: preUpgrade failed (exit status 7)"), "{err}");
        let no_setup = setup_to_run(None, &failing, Some((2, 1))).unwrap();
        assert!(no_setup.script.contains("HERD_TO_REVISION=1"), "a revert runs the hooks too, with no setup");
    }
}
