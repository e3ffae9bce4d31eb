//! `herd apply -f` and `herd delete`.

use std::io::Read;
use std::path::Path;

use anyhow::{Context, bail};
use herd_client::{Client, ClientError, WriteOptions};
use serde_json::Value;

use crate::{kinds, manifest_lines};

/// One document of a manifest, with where it came from: its file, its
/// text and the line it starts on (for the lines errors point at).
struct Document {
    value: Value,
    file: String,
    text: String,
    start: usize,
    /// Its place in its file (1-based).
    number: usize,
}

impl Document {
    /// `file document 2` and, when a field is named, the line it is on.
    fn at(&self, field: Option<&str>) -> String {
        let line = field.and_then(|f| manifest_lines::line_of(&self.text, f)).map(|l| l + self.start - 1);
        match line {
            Some(line) => format!("{} document {} (line {line})", self.file, self.number),
            None => format!("{} document {}", self.file, self.number),
        }
    }

    /// `file document 2 (line 14)`, for a line within the document.
    fn at_line(&self, line: Option<u64>) -> String {
        match line.and_then(|l| usize::try_from(l).ok()) {
            Some(line) => format!("{} document {} (line {})", self.file, self.number, line + self.start - 1),
            None => format!("{} document {}", self.file, self.number),
        }
    }

    /// The errors, each at its line.
    fn explain(&self, errors: &herd_core::ValidationErrors) -> String {
        let first = errors.errors.first().map(|e| e.field.as_str());
        format!("{}: {errors}", self.at(first))
    }
}

/// The documents of a YAML (or JSON, which is YAML) file; `-` is stdin;
/// a directory is its `.yaml`, `.yml` and `.json` files in name order.
fn read_documents(path: &Path) -> anyhow::Result<Vec<Document>> {
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
    let mut documents = Vec::new();
    for (text, start) in manifest_lines::documents(&text) {
        let value: Value = serde_saphyr::from_str(&text)
            .with_context(|| format!("{} (from line {start}) is not valid YAML or JSON", path.display()))?;
        if !value.is_null() {
            let number = documents.len() + 1;
            documents.push(Document { value, file: path.display().to_string(), text, start, number });
        }
    }
    Ok(documents)
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
    for document in &documents {
        let kind_field = document
            .value
            .get("kind")
            .and_then(Value::as_str)
            .with_context(|| format!("{}: kind: missing", document.at(None)))?;
        let kind = kinds::by_kind(kind_field)
            .with_context(|| format!("{}: kind: unknown kind {kind_field:?}", document.at(Some("kind"))))?;
        let normalized = (kind.normalize)(&document.text).map_err(|refused| match refused {
            kinds::Manifest::Invalid(errors) => anyhow::anyhow!("{}", document.explain(&errors)),
            kinds::Manifest::Unreadable { field, line, reason } => {
                anyhow::anyhow!("{}: {field}: {reason}", document.at_line(line))
            }
        })?;
        checked.push((kind, normalized, document));
    }
    let options = WriteOptions { dry_run };
    let suffix = if dry_run { " (dry run)" } else { "" };
    for (kind, document, source) in checked {
        // A refusal by the server names the field: at its line here.
        let refused = |error: ClientError| -> anyhow::Error {
            match &error {
                ClientError::Api(status) if !status.causes.is_empty() => {
                    let at = source.at(status.causes.first().map(|c| c.field.as_str()));
                    anyhow::anyhow!("{at}: {error}")
                }
                _ => error.into(),
            }
        };
        let name = document.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
        let label = format!("{}/{name}", kind.kind.to_ascii_lowercase());
        let mut attempts = 0;
        loop {
            attempts += 1;
            let current = match client.get_value(kind.plural, &name).await {
                Ok(current) => current,
                Err(error) if error.is_not_found() => {
                    client.create_value(kind.plural, &document, options).await.map_err(refused)?;
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
                Err(error) => return Err(refused(error)),
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
