//! [`Answer`]: what an agent (or the reconciler, which found out for
//! itself) answered for a Command, with the facts the action produced
//! typed by what produced them ([`AnswerDetails`]). On the wire the facts
//! are a flat map of words (`instanceId`, `exitCode`, `checksum.data`),
//! as scripts and dashboards read them; in herd they are never read by
//! key.

use std::borrow::Cow;
use std::collections::BTreeMap;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Serialize};

/// What the agent answered.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Answer {
    pub success: bool,
    pub message: String,
    /// Facts the action produced: the copied volume's size and checksum,
    /// the started member's instance id, the script's exit code.
    #[serde(default, skip_serializing_if = "AnswerDetails::is_none")]
    pub details: AnswerDetails,
}

impl Answer {
    /// An answer with no facts.
    pub fn said(success: bool, message: impl Into<String>) -> Self {
        Answer { success, message: message.into(), details: AnswerDetails::None }
    }

    /// The tail of a script's standard error, at most `chars` characters
    /// (None when it wrote nothing).
    pub fn stderr_tail(&self, chars: usize) -> Option<&str> {
        let AnswerDetails::Script { stderr, .. } = &self.details else { return None };
        let stderr = stderr.trim();
        if stderr.is_empty() || chars == 0 {
            return None;
        }
        let start = stderr.char_indices().rev().nth(chars - 1).map_or(0, |(i, _)| i);
        Some(&stderr[start..])
    }
}

/// The facts an action produced, by the kind of action that produced them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum AnswerDetails {
    /// None (a stop, a removal, a deletion, a failure before anything ran).
    #[default]
    None,
    /// A member runs as `instance_id` (a start, or a move with its data:
    /// then each moved volume's checksum on the target, by volume).
    Started { instance_id: String, checksums: BTreeMap<String, String> },
    /// A script ran to its end.
    Script { exit_code: i32, stdout: String, stderr: String },
    /// A volume's copy holds the source's files. The reconciler, which
    /// only compared the two, knows the checksum alone.
    Copied { checksum: String, size: Option<u64>, files: Option<u64>, bytes_fetched: Option<u64> },
    /// A leader stood down at this position (what its `position` command
    /// printed then).
    StoodDown { position: String },
}

const INSTANCE_ID: &str = "instanceId";
const CHECKSUM_OF: &str = "checksum.";
const EXIT_CODE: &str = "exitCode";
const STDOUT: &str = "stdout";
const STDERR: &str = "stderr";
const CHECKSUM: &str = "checksum";
const SIZE: &str = "size";
const FILES: &str = "files";
const BYTES_FETCHED: &str = "bytesFetched";
const POSITION: &str = "position";

impl AnswerDetails {
    pub fn is_none(&self) -> bool {
        matches!(self, AnswerDetails::None)
    }

    /// The instance a start or a move left running.
    pub fn instance_id(&self) -> Option<&str> {
        match self {
            AnswerDetails::Started { instance_id, .. } => Some(instance_id),
            _ => None,
        }
    }

    /// The words on the wire.
    fn to_words(&self) -> BTreeMap<String, String> {
        let mut words = BTreeMap::new();
        let mut put = |key: &str, value: String| {
            words.insert(key.to_string(), value);
        };
        match self {
            AnswerDetails::None => {}
            AnswerDetails::Started { instance_id, checksums } => {
                put(INSTANCE_ID, instance_id.clone());
                for (volume, checksum) in checksums {
                    put(&format!("{CHECKSUM_OF}{volume}"), checksum.clone());
                }
            }
            AnswerDetails::Script { exit_code, stdout, stderr } => {
                put(EXIT_CODE, exit_code.to_string());
                put(STDOUT, stdout.clone());
                put(STDERR, stderr.clone());
            }
            AnswerDetails::Copied { checksum, size, files, bytes_fetched } => {
                put(CHECKSUM, checksum.clone());
                for (key, count) in [(SIZE, size), (FILES, files), (BYTES_FETCHED, bytes_fetched)] {
                    if let Some(count) = count {
                        put(key, count.to_string());
                    }
                }
            }
            AnswerDetails::StoodDown { position } => put(POSITION, position.clone()),
        }
        words
    }

    /// Reads the words on the wire: which facts they are follows from
    /// the words present; a word that belongs to none is refused.
    fn from_words(mut words: BTreeMap<String, String>) -> Result<Self, String> {
        let mut take = |key: &str| words.remove(key);
        let details = if let Some(exit_code) = take(EXIT_CODE) {
            let exit_code = exit_code.parse().map_err(|_| format!("{EXIT_CODE} {exit_code:?} is not a number"))?;
            AnswerDetails::Script {
                exit_code,
                stdout: take(STDOUT).unwrap_or_default(),
                stderr: take(STDERR).unwrap_or_default(),
            }
        } else if let Some(instance_id) = take(INSTANCE_ID) {
            let checksums = words
                .extract_if(.., |key, _| key.starts_with(CHECKSUM_OF))
                .map(|(key, checksum)| (key[CHECKSUM_OF.len()..].to_string(), checksum))
                .collect();
            AnswerDetails::Started { instance_id, checksums }
        } else if let Some(checksum) = take(CHECKSUM) {
            let mut count = |key: &str| -> Result<Option<u64>, String> {
                words.remove(key).map(|n| n.parse().map_err(|_| format!("{key} {n:?} is not a count"))).transpose()
            };
            AnswerDetails::Copied {
                checksum,
                size: count(SIZE)?,
                files: count(FILES)?,
                bytes_fetched: count(BYTES_FETCHED)?,
            }
        } else if let Some(position) = take(POSITION) {
            AnswerDetails::StoodDown { position }
        } else {
            AnswerDetails::None
        };
        match words.keys().next() {
            Some(stray) => Err(format!("{stray:?} is no fact of the answer's kind ({})", details.kind())),
            None => Ok(details),
        }
    }

    fn kind(&self) -> &'static str {
        match self {
            AnswerDetails::None => "no facts",
            AnswerDetails::Started { .. } => "a member started",
            AnswerDetails::Script { .. } => "a script's run",
            AnswerDetails::Copied { .. } => "a volume copied",
            AnswerDetails::StoodDown { .. } => "a leader stood down",
        }
    }
}

impl Serialize for AnswerDetails {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.to_words().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for AnswerDetails {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let words = BTreeMap::<String, String>::deserialize(deserializer)?;
        AnswerDetails::from_words(words).map_err(serde::de::Error::custom)
    }
}

/// On the wire: a map of words, as it always was.
impl JsonSchema for AnswerDetails {
    fn inline_schema() -> bool {
        true
    }
    fn schema_name() -> Cow<'static, str> {
        <BTreeMap<String, String> as JsonSchema>::schema_name()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        <BTreeMap<String, String> as JsonSchema>::json_schema(generator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn words(pairs: &[(&str, &str)]) -> serde_json::Value {
        serde_json::Value::Object(pairs.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect())
    }

    #[test]
    fn each_kind_of_facts_keeps_its_words_on_the_wire() {
        let started = AnswerDetails::Started {
            instance_id: "i-1".into(),
            checksums: BTreeMap::from([("data".into(), "abc".into())]),
        };
        assert_eq!(serde_json::to_value(&started).unwrap(), words(&[("instanceId", "i-1"), ("checksum.data", "abc")]));
        let script = AnswerDetails::Script { exit_code: 3, stdout: "hi\n".into(), stderr: String::new() };
        assert_eq!(
            serde_json::to_value(&script).unwrap(),
            words(&[("exitCode", "3"), ("stdout", "hi\n"), ("stderr", "")])
        );
        let copied =
            AnswerDetails::Copied { checksum: "c".into(), size: Some(10), files: Some(2), bytes_fetched: None };
        assert_eq!(serde_json::to_value(&copied).unwrap(), words(&[("checksum", "c"), ("size", "10"), ("files", "2")]));
        let stood_down = AnswerDetails::StoodDown { position: "0/3000060".into() };
        assert_eq!(serde_json::to_value(&stood_down).unwrap(), words(&[("position", "0/3000060")]));
        let answer = Answer::said(true, "stopped");
        assert_eq!(serde_json::to_value(&answer).unwrap(), serde_json::json!({"success": true, "message": "stopped"}));
    }

    #[test]
    fn words_that_fit_no_kind_are_refused_naming_the_word() {
        let error = serde_json::from_value::<AnswerDetails>(words(&[("instanceId", "i"), ("exitCod", "1")]));
        assert!(error.unwrap_err().to_string().contains("\"exitCod\""));
        let error = serde_json::from_value::<AnswerDetails>(words(&[("exitCode", "three")]));
        assert!(error.unwrap_err().to_string().contains("not a number"));
    }

    #[test]
    fn the_stderr_tail_is_the_last_characters_trimmed() {
        let answer = Answer {
            success: false,
            message: "the script exited with 1".into(),
            details: AnswerDetails::Script { exit_code: 1, stdout: String::new(), stderr: "  abcdé\n".into() },
        };
        assert_eq!(answer.stderr_tail(3), Some("cdé"));
        assert_eq!(answer.stderr_tail(100), Some("abcdé"));
        assert_eq!(Answer::said(false, "no").stderr_tail(10), None);
    }

    fn any_details() -> impl Strategy<Value = AnswerDetails> {
        let text = || ".{0,12}";
        prop_oneof![
            Just(AnswerDetails::None),
            (text(), prop::collection::btree_map("[a-z.]{0,8}", text(), 0..3))
                .prop_map(|(instance_id, checksums)| AnswerDetails::Started { instance_id, checksums }),
            (any::<i32>(), text(), text()).prop_map(|(exit_code, stdout, stderr)| AnswerDetails::Script {
                exit_code,
                stdout,
                stderr
            }),
            (text(), any::<Option<u64>>(), any::<Option<u64>>(), any::<Option<u64>>()).prop_map(
                |(checksum, size, files, bytes_fetched)| AnswerDetails::Copied { checksum, size, files, bytes_fetched }
            ),
            text().prop_map(|position| AnswerDetails::StoodDown { position }),
        ]
    }

    proptest! {
        #[test]
        fn facts_read_back_as_written(details in any_details()) {
            let wire = serde_json::to_string(&details).unwrap();
            prop_assert_eq!(serde_json::from_str::<AnswerDetails>(&wire).unwrap(), details);
        }
    }
}
