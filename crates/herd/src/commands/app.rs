//! `herd app history`: an App's revisions, each with what it changed.

use herd_client::Client;
use herd_core::kinds::AppSpec;
use herd_core::kinds::app_revision::{AppRevisionSpec, changed_fields};

use crate::output::plain_table;

pub async fn history(client: &Client, name: &str) -> anyhow::Result<()> {
    // Said as any other missing object is.
    client.get::<AppSpec>(name).await?;
    let mut revisions: Vec<_> =
        client.list::<AppRevisionSpec>("").await?.into_iter().filter(|r| r.spec.app == name).collect();
    revisions.sort_by_key(|r| r.spec.revision);
    let mut before: Option<&AppSpec> = None;
    let mut rows = Vec::new();
    for revision in &revisions {
        let changed = match before {
            None => "(the oldest kept)".to_string(),
            Some(before) => changed_fields(before, &revision.spec.app_spec).join(", "),
        };
        let created = revision.metadata.creation_timestamp.map(|t| t.to_string()).unwrap_or_default();
        rows.push(vec![revision.spec.revision.to_string(), created, changed]);
        before = Some(&revision.spec.app_spec);
    }
    println!("{}", plain_table(Some(vec!["REVISION", "CREATED", "CHANGED"]), rows.into_iter()));
    Ok(())
}
