//! The setup status file: how the outcome of a member's `--configure` run
//! survives an agent restart or a member restart (KubeDirector's
//! configure.status). The agent writes `<instance id>=` before the script
//! starts and `<instance id>=<exit code>` when it ends; when what it saw
//! adds to the code (the wrapper could not write the file: the volume is
//! full) a note follows it (`<instance>=1 no space left ...`), and a run
//! with no exit code to give (killed at its timeout, or gone without
//! recording one) is `<instance>=- <why>`. The next passes read it. Pure:
//! the file's text in, the outcome out.

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
    /// Finished with another exit code, or with none (timed out, lost):
    /// config error, with what the agent noted.
    Failed { code: Option<i32>, note: Option<String> },
    /// The file holds something else (written by hand, or torn).
    Unreadable(String),
}

/// The line the launcher writes before the script starts.
pub fn launched(instance: &str) -> String {
    format!("{instance}=\n")
}

/// The line written when the script ended with `code`.
pub fn finished(instance: &str, code: i32) -> String {
    format!("{instance}={code}\n")
}

/// The line written when the script ended with `code` and the agent has
/// something to add (why the wrapper could not record it).
pub fn finished_noted(instance: &str, code: i32, note: &str) -> String {
    format!("{instance}={code} {}\n", one_line(note))
}

/// The line written for a run that ended with no exit code to give.
pub fn ended_without_code(instance: &str, why: &str) -> String {
    format!("{instance}=- {}\n", one_line(why))
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The line's instance and what follows the `=`.
fn split(line: &str) -> Option<(&str, &str)> {
    line.split_once('=')
}

/// The instance a status file names, if it reads.
pub fn status_instance(text: Option<&str>) -> Option<&str> {
    text.map(str::trim).and_then(split).map(|(instance, _)| instance)
}

/// Whether the status file records the end of `instance`'s setup.
pub fn ended(text: Option<&str>, instance: &str) -> bool {
    text.map(str::trim).and_then(split).is_some_and(|(of, end)| of == instance && !end.trim().is_empty())
}

/// Reads the status file's text (None: no file) for the member's
/// `current` instance.
pub fn setup_outcome(text: Option<&str>, current: &str) -> SetupOutcome {
    let Some(line) = text.map(str::trim).filter(|t| !t.is_empty()) else { return SetupOutcome::NotStarted };
    let Some((instance, end)) = split(line) else {
        return SetupOutcome::Unreadable(format!("{line:?} is not `<instance>=<exit code>`"));
    };
    let (code, note) = match end.trim().split_once(' ') {
        Some((code, note)) => (code, Some(note.trim().to_string()).filter(|n| !n.is_empty())),
        None => (end.trim(), None),
    };
    match code {
        "" if instance == current => SetupOutcome::Running,
        "" => SetupOutcome::Interrupted { instance: instance.to_string() },
        "0" => SetupOutcome::Succeeded,
        "-" => SetupOutcome::Failed { code: None, note },
        code => match code.parse() {
            Ok(code) => SetupOutcome::Failed { code: Some(code), note },
            Err(_) => SetupOutcome::Unreadable(format!("exit code {code:?} is not a number")),
        },
    }
}

impl SetupOutcome {
    /// The member's configErrorDetail for a failed setup: its exit code
    /// (or why it has none), what the agent noted, and the tail of its
    /// standard error.
    pub fn error_detail(code: Option<i32>, note: Option<&str>, stderr_tail: &str) -> String {
        let mut detail = match (code, note) {
            (Some(code), None) => format!("configure failed with exit status {code}"),
            (Some(code), Some(note)) => format!("configure failed with exit status {code} ({note})"),
            (None, Some(note)) => format!("configure failed: {note}"),
            (None, None) => "configure failed".to_string(),
        };
        let tail = stderr_tail.trim();
        if !tail.is_empty() {
            detail.push_str(": ");
            detail.push_str(tail);
        }
        detail
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
        assert_eq!(setup_outcome(Some(&finished("i1", 3)), "i1"), SetupOutcome::Failed { code: Some(3), note: None });
        assert_eq!(
            SetupOutcome::error_detail(Some(1), None, "etcd: member exists\n"),
            "configure failed with exit status 1: etcd: member exists"
        );
        assert_eq!(SetupOutcome::error_detail(Some(2), None, " "), "configure failed with exit status 2");
    }

    #[test]
    fn rule_a_run_with_no_exit_code_or_a_note_is_a_config_error_saying_why() {
        let full = "its status could not be written: no space left on the member's volume (0 B free)";
        let noted = finished_noted("i1", 1, full);
        assert_eq!(setup_outcome(Some(&noted), "i1"), SetupOutcome::Failed { code: Some(1), note: Some(full.into()) });
        assert!(ended(Some(&noted), "i1") && !ended(Some(&noted), "i2") && !ended(Some(&launched("i1")), "i1"));
        let lost = ended_without_code("i1", "timed out after 60 s;\nkilled");
        assert_eq!(
            setup_outcome(Some(&lost), "i2"),
            SetupOutcome::Failed { code: None, note: Some("timed out after 60 s; killed".into()) },
            "one line, whichever instance ran it"
        );
        assert_eq!(
            SetupOutcome::error_detail(None, Some("timed out after 60 s; killed"), "waiting for etcd"),
            "configure failed: timed out after 60 s; killed: waiting for etcd"
        );
        assert_eq!(
            SetupOutcome::error_detail(Some(1), Some(full), ""),
            format!("configure failed with exit status 1 ({full})")
        );
        assert_eq!(status_instance(Some("i1=- a=b")), Some("i1"), "a note may hold an =");
    }

    #[test]
    fn rule_anything_else_is_unreadable_and_says_why() {
        assert!(matches!(setup_outcome(Some("garbage"), "i1"), SetupOutcome::Unreadable(_)));
        assert!(matches!(setup_outcome(Some("i1=x"), "i1"), SetupOutcome::Unreadable(_)));
    }
}
