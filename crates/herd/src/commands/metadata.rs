//! `herd label` and `herd annotate`, as kubectl's: `key=value` sets,
//! `key-` removes, a key already set is changed only with `--overwrite`.
//! Sent as one JSON merge patch: with `--overwrite`, unpinned (a
//! heartbeat or another writer in between changes nothing it touches);
//! without, pinned to the revision the check was made at, and checked and
//! sent again when the object moved meanwhile, so that no key set in
//! between is overwritten and no 409 reaches the user for a write that
//! touched other fields.

use std::collections::BTreeMap;
use std::time::Instant;

use herd_client::Client;
use herd_core::api::StatusReason;
use herd_core::backoff::Contention;
use serde_json::{Value, json};

use crate::cli::MetadataArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Field {
    Labels,
    Annotations,
}

impl Field {
    fn key(self) -> &'static str {
        match self {
            Field::Labels => "labels",
            Field::Annotations => "annotations",
        }
    }
}

/// The changes asked for: a value to set, or None to remove.
fn parse(changes: &[String]) -> Result<BTreeMap<String, Option<String>>, crate::Usage> {
    let mut parsed = BTreeMap::new();
    for change in changes {
        let (key, value) = match (change.split_once('='), change.strip_suffix('-')) {
            (Some((key, value)), _) => (key, Some(value.to_string())),
            (None, Some(key)) => (key, None),
            (None, None) => {
                return Err(crate::Usage(format!("{change:?}: give key=value to set or key- to remove")));
            }
        };
        if key.is_empty() {
            return Err(crate::Usage(format!("{change:?}: the key is empty")));
        }
        if parsed.insert(key.to_string(), value).is_some() {
            return Err(crate::Usage(format!("{key:?} is given twice")));
        }
    }
    Ok(parsed)
}

pub async fn change(client: &Client, field: Field, args: &MetadataArgs) -> anyhow::Result<()> {
    let changes = parse(&args.changes)?;
    let kind = crate::kinds::resolve(&args.kind)?;
    let values: serde_json::Map<String, Value> =
        changes.iter().map(|(key, value)| (key.clone(), value.clone().map_or(Value::Null, Value::String))).collect();
    let what = format!("{}/{}", kind.kind.to_ascii_lowercase(), args.name);
    // A pinned patch whose object moved between the read and the write is
    // checked and sent again.
    let mut contention = Contention::new(Instant::now());
    loop {
        let patch = if args.overwrite {
            json!({ "metadata": { field.key(): values } })
        } else {
            let object = client.get_value(kind.plural, &args.name).await?;
            let current = &object["metadata"][field.key()];
            let set: Vec<&str> = changes
                .iter()
                .filter(|(key, value)| value.is_some() && current.get(key.as_str()).is_some())
                .map(|(key, _)| key.as_str())
                .collect();
            if !set.is_empty() {
                anyhow::bail!("{what} has {} set already: {} (--overwrite changes them)", field.key(), set.join(", "));
            }
            let revision = object["metadata"]["resourceVersion"].clone();
            json!({ "metadata": { "resourceVersion": revision, field.key(): values } })
        };
        match client.patch_value(kind.plural, &args.name, &patch).await {
            Ok(_) => break,
            Err(error) if !args.overwrite && error.reason() == Some(StatusReason::Conflict) => {
                match contention.lost(Instant::now()) {
                    Some(pause) => tokio::time::sleep(pause).await,
                    None => return Err(error.into()),
                }
            }
            Err(error) => return Err(error.into()),
        }
    }
    let word = match field {
        Field::Labels => "labeled",
        Field::Annotations => "annotated",
    };
    println!("{what} {word}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changes_read_as_kubectl_reads_them() {
        let given = ["zone=a", "old-", "empty="].map(String::from);
        let parsed = parse(&given).unwrap();
        assert_eq!(parsed["zone"], Some("a".into()));
        assert_eq!(parsed["old"], None);
        assert_eq!(parsed["empty"], Some(String::new()));
        for bad in ["novalue", "=x", "-"] {
            assert!(parse(&[bad.to_string()]).is_err(), "{bad}");
        }
        assert!(parse(&["a=1".into(), "a-".into()]).unwrap_err().0.contains("twice"));
    }
}
