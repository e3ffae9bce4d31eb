//! `herd label` and `herd annotate`, as kubectl's: `key=value` sets,
//! `key-` removes, a key already set is changed only with `--overwrite`.
//! Sent as one JSON merge patch pinned to the revision the check was made
//! at, so an object changed in between is refused (409), not overwritten.

use std::collections::BTreeMap;

use herd_client::Client;
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
    let object = client.get_value(kind.plural, &args.name).await?;
    let current = &object["metadata"][field.key()];
    if !args.overwrite {
        let set: Vec<&str> = changes
            .iter()
            .filter(|(key, value)| value.is_some() && current.get(key.as_str()).is_some())
            .map(|(key, _)| key.as_str())
            .collect();
        if !set.is_empty() {
            anyhow::bail!(
                "{}/{} has {} set already: {} (--overwrite changes them)",
                kind.kind.to_ascii_lowercase(),
                args.name,
                field.key(),
                set.join(", ")
            );
        }
    }
    let values: serde_json::Map<String, Value> =
        changes.into_iter().map(|(key, value)| (key, value.map_or(Value::Null, Value::String))).collect();
    let revision = object["metadata"]["resourceVersion"].clone();
    let patch = json!({ "metadata": { "resourceVersion": revision, field.key(): values } });
    client.patch_value(kind.plural, &args.name, &patch).await?;
    let word = match field {
        Field::Labels => "labeled",
        Field::Annotations => "annotated",
    };
    println!("{}/{} {word}", kind.kind.to_ascii_lowercase(), args.name);
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
