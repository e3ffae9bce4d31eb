//! `herd apply -f` and `herd delete`.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use herd_client::{Client, ClientError, WriteOptions};
use serde_json::Value;

use crate::kinds;

/// The documents of a YAML (or JSON, which is YAML) file; `-` is stdin;
/// a directory is its `.yaml`, `.yml` and `.json` files in name order.
fn read_documents(path: &Path) -> anyhow::Result<Vec<Value>> {
    if path.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(path)
            .with_context(|| format!("reading {}", path.display()))?
            .flatten()
            .map(|entry| entry.path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml" || e == "json"))
            .collect();
        files.sort();
        let mut documents = Vec::new();
        for file in files {
            documents.extend(read_documents(&file)?);
        }
        return Ok(documents);
    }
    let text = if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("reading stdin")?;
        text
    } else {
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?
    };
    let documents: Vec<Value> =
        serde_saphyr::from_multiple(&text).with_context(|| format!("{} is not valid YAML or JSON", path.display()))?;
    Ok(documents.into_iter().filter(|d| !d.is_null()).collect())
}

/// Fields the user owns; equal ones mean there is nothing to apply.
fn owned(value: &Value) -> [Option<&Value>; 3] {
    [value.pointer("/metadata/labels"), value.pointer("/metadata/annotations"), value.get("spec")]
}

pub async fn apply(client: &Client, path: &Path, dry_run: bool) -> anyhow::Result<()> {
    let documents = read_documents(path)?;
    if documents.is_empty() {
        bail!("{} has no objects", path.display());
    }
    // Check every document before changing anything.
    let mut checked = Vec::new();
    for (index, document) in documents.into_iter().enumerate() {
        let where_ = format!("{} document {}", path.display(), index + 1);
        let kind_field =
            document.get("kind").and_then(Value::as_str).with_context(|| format!("{where_}: kind: missing"))?;
        let kind =
            kinds::by_kind(kind_field).with_context(|| format!("{where_}: kind: unknown kind {kind_field:?}"))?;
        let normalized = (kind.normalize)(document).map_err(|errors| anyhow::anyhow!("{where_}: {errors}"))?;
        checked.push((kind, normalized));
    }
    let options = WriteOptions { dry_run };
    let suffix = if dry_run { " (dry run)" } else { "" };
    for (kind, document) in checked {
        let name = document.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let label = format!("{}/{name}", kind.kind.to_ascii_lowercase());
        let mut attempts = 0;
        loop {
            attempts += 1;
            let current = match client.get_value(kind.plural, &name).await {
                Ok(current) => current,
                Err(error) if error.is_not_found() => {
                    client.create_value(kind.plural, &document, options).await?;
                    println!("{label} created{suffix}");
                    break;
                }
                Err(error) => return Err(error.into()),
            };
            if owned(&current) == owned(&document) {
                println!("{label} unchanged");
                break;
            }
            let mut desired = document.clone();
            desired["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"].clone();
            match client.replace_value(kind.plural, &name, &desired, options).await {
                Ok(_) => {
                    println!("{label} configured{suffix}");
                    break;
                }
                // Someone else wrote in between: read again and retry.
                Err(ClientError::Api(status)) if status.code == 409 && attempts < 5 => continue,
                Err(error) => return Err(error.into()),
            }
        }
    }
    Ok(())
}

pub async fn delete(client: &Client, kind: &str, name: &str, dry_run: bool) -> anyhow::Result<()> {
    let kind = kinds::resolve(kind)?;
    client.delete_value(kind.plural, name, WriteOptions { dry_run }).await?;
    println!("{}/{name} deleted{}", kind.kind.to_ascii_lowercase(), if dry_run { " (dry run)" } else { "" });
    Ok(())
}
