//! The setup status file: how the outcome of a member's `--configure` run
//! survives an agent restart or a member restart (the seed's
//! configure.status). The launcher writes `<instance id>=` before the
//! script starts and `<instance id>=<exit code>` when it ends; the next
//! passes read it. Pure: the file's text in, the outcome out.

/// What the status file says of the setup of the member's current instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SetupOutcome {
    /// No setup was launched (no file, or an empty one).
    NotStarted,
    /// Launched in this instance and not finished: wait.
    Running,
    /// Launched in another instance, which ended before setup did: it was
    /// interrupted; set up again.
    Interrupted { instance: String },
    /// Finished with exit code 0: configured.
    Succeeded,
    /// Finished with another exit code: config error.
    Failed { code: i32 },
    /// The file holds something else (written by hand, or torn).
    Unreadable(String),
}

/// The line the launcher writes before the script starts.
pub fn launched(instance: &str) -> String {
    format!("{instance}=\n")
}

/// The line the launcher writes when the script ends.
pub fn finished(instance: &str, code: i32) -> String {
    format!("{instance}={code}\n")
}

/// The instance a status file names, if it reads.
pub fn status_instance(text: Option<&str>) -> Option<&str> {
    text.map(str::trim).and_then(|line| line.rsplit_once('=')).map(|(instance, _)| instance)
}

/// Reads the status file's text (None: no file) for the member's
/// `current` instance.
pub fn setup_outcome(text: Option<&str>, current: &str) -> SetupOutcome {
    let Some(line) = text.map(str::trim).filter(|t| !t.is_empty()) else { return SetupOutcome::NotStarted };
    let Some((instance, code)) = line.rsplit_once('=') else {
        return SetupOutcome::Unreadable(format!("{line:?} is not `<instance>=<exit code>`"));
    };
    match code.trim() {
        "" if instance == current => SetupOutcome::Running,
        "" => SetupOutcome::Interrupted { instance: instance.to_string() },
        "0" => SetupOutcome::Succeeded,
        code => match code.parse() {
            Ok(code) => SetupOutcome::Failed { code },
            Err(_) => SetupOutcome::Unreadable(format!("exit code {code:?} is not a number")),
        },
    }
}

impl SetupOutcome {
    /// The member's configErrorDetail for a failed setup, with the tail of
    /// its standard error.
    pub fn error_detail(code: i32, stderr_tail: &str) -> String {
        let tail = stderr_tail.trim();
        if tail.is_empty() {
            format!("configure failed with exit status {code}")
        } else {
            format!("configure failed with exit status {code}: {tail}")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule_no_file_or_an_empty_one_means_setup_never_started() {
        assert_eq!(setup_outcome(None, "i1"), SetupOutcome::NotStarted);
        assert_eq!(setup_outcome(Some("\n"), "i1"), SetupOutcome::NotStarted);
    }

    #[test]
    fn rule_launched_in_this_instance_and_not_finished_is_running() {
        assert_eq!(setup_outcome(Some(&launched("i1")), "i1"), SetupOutcome::Running);
    }

    #[test]
    fn rule_launched_in_another_instance_and_not_finished_was_interrupted() {
        assert_eq!(setup_outcome(Some(&launched("i1")), "i2"), SetupOutcome::Interrupted { instance: "i1".into() });
    }

    #[test]
    fn rule_exit_zero_is_configured_and_anything_else_a_config_error() {
        assert_eq!(setup_outcome(Some(&finished("i1", 0)), "i2"), SetupOutcome::Succeeded, "whichever instance ran it");
        assert_eq!(setup_outcome(Some(&finished("i1", 3)), "i1"), SetupOutcome::Failed { code: 3 });
        assert_eq!(
            SetupOutcome::error_detail(1, "etcd: member exists\n"),
            "configure failed with exit status 1: etcd: member exists"
        );
        assert_eq!(SetupOutcome::error_detail(2, " "), "configure failed with exit status 2");
    }

    #[test]
    fn rule_anything_else_is_unreadable_and_says_why() {
        assert!(matches!(setup_outcome(Some("garbage"), "i1"), SetupOutcome::Unreadable(_)));
        assert!(matches!(setup_outcome(Some("i1=x"), "i1"), SetupOutcome::Unreadable(_)));
    }
}
