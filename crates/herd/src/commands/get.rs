//! `herd get`, `herd describe`, `herd events`.

use herd_client::Client;
use herd_core::Resource;
use herd_core::kinds::{AppClusterSpec, CommandSpec, MemberSpec};
use serde_json::{Value, json};

use crate::cli::OutputFormat;
use crate::kinds;
use crate::output;

pub async fn get(
    client: &Client,
    kind: &str,
    name: Option<&str>,
    selector: &str,
    format: OutputFormat,
) -> anyhow::Result<()> {
    if kind == "all" && name.is_none() {
        return all(client, selector, format).await;
    }
    let kind = kinds::resolve(kind)?;
    match name {
        Some(name) => {
            let object = client.get_value(kind.plural, name).await?;
            output::print(kind.kind, &object, std::slice::from_ref(&object), &format)
        }
        None => {
            let list = client.list_values(kind.plural, selector).await?;
            let value = serde_json::to_value(&list)?;
            output::print(kind.kind, &value, &list.items, &format)
        }
    }
}

/// `herd get all`: every kind's objects, a table each (kinds with none
/// left out); as JSON or YAML one list of them all.
async fn all(client: &Client, selector: &str, format: OutputFormat) -> anyhow::Result<()> {
    let mut everything = Vec::new();
    for kind in kinds::all() {
        let items = client.list_values(kind.plural, selector).await?.items;
        if items.is_empty() {
            continue;
        }
        match format {
            OutputFormat::Table | OutputFormat::Wide => {
                println!("{}:\n{}\n", kind.plural, output::table(kind.kind, &items, format == OutputFormat::Wide));
            }
            OutputFormat::Name => output::print(kind.kind, &Value::Null, &items, &format)?,
            OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_) => everything.extend(items),
        }
    }
    if matches!(format, OutputFormat::Json | OutputFormat::Yaml | OutputFormat::JsonPath(_)) {
        output::print("List", &json!({ "kind": "List", "items": everything }), &everything, &format)?;
    }
    Ok(())
}

/// `herd get -w`: the objects (or the one named) as they are, then each
/// change as the store's watch brings it, from the list's revision on (so
/// none is missed between the two), across servers (`Client::follow`: a
/// server that goes silent is left for the next; bookmarks are not rows).
pub async fn watch(
    client: &Client,
    kind: &str,
    name: Option<&str>,
    selector: &str,
    format: OutputFormat,
) -> anyhow::Result<()> {
    let kind = kinds::resolve(kind)?;
    let list = client.list_values(kind.plural, selector).await?;
    let named =
        |object: &Value| name.is_none_or(|name| object.pointer("/metadata/name").and_then(Value::as_str) == Some(name));
    let items: Vec<Value> = list.items.iter().filter(|o| named(o)).cloned().collect();
    output::print(kind.kind, &json!({ "kind": format!("{}List", kind.kind), "items": items }), &items, &format)?;
    let mut changes = client.follow(kind.plural, &list.metadata.resource_version, selector);
    loop {
        let event = changes.next().await?;
        if named(&event.object) {
            output::print_change(kind.kind, &event.object, &format)?;
        }
    }
}

/// `herd get` with no kind: the kinds and the names they go by.
pub fn kinds() {
    let mut table = comfy_table::Table::new();
    table.load_preset(comfy_table::presets::NOTHING);
    table.set_header(["NAME", "SHORT", "KIND"]);
    for kind in kinds::all() {
        table.add_row([kind.plural, kind.short, kind.kind]);
    }
    table.add_row(["all", "", "(every kind above)"]);
    for line in table.lines() {
        println!("{}", line.strip_prefix(' ').unwrap_or(&line).trim_end());
    }
}

fn timestamp(event: &Value) -> String {
    event.pointer("/spec/lastTimestamp").and_then(Value::as_str).unwrap_or_default().to_string()
}

/// Whether an Event is about `about` (`(kind, name)`; None: about anything).
fn is_about(event: &Value, about: Option<(&str, &str)>) -> bool {
    about.is_none_or(|(kind, name)| {
        event.pointer("/spec/involvedObject/kind").and_then(Value::as_str) == Some(kind)
            && event.pointer("/spec/involvedObject/name").and_then(Value::as_str) == Some(name)
    })
}

/// Whether an Event is about AppCluster `cluster` (roles `roles`), one of
/// its members (`<cluster>-<role>-<index>`, gone ones too) or one of their
/// Commands (`<member>.<purpose>.<id>`).
fn of_cluster(event: &Value, cluster: &str, roles: &[String]) -> bool {
    let kind = event.pointer("/spec/involvedObject/kind").and_then(Value::as_str).unwrap_or_default();
    let name = event.pointer("/spec/involvedObject/name").and_then(Value::as_str).unwrap_or_default();
    let member_named = |name: &str| {
        roles.iter().any(|role| {
            name.strip_prefix(&format!("{cluster}-{role}-"))
                .is_some_and(|index| !index.is_empty() && index.bytes().all(|b| b.is_ascii_digit()))
        })
    };
    match kind {
        AppClusterSpec::KIND => name == cluster,
        MemberSpec::KIND => member_named(name),
        CommandSpec::KIND => name.split_once('.').is_some_and(|(member, _)| member_named(member)),
        _ => false,
    }
}

/// Events about one object (`kind/name`), or all, oldest first, and the
/// revision they were listed at.
async fn list_events(client: &Client, about: Option<(&str, &str)>) -> anyhow::Result<(Vec<Value>, String)> {
    let list = client.list_values("events", "").await?;
    let mut events: Vec<Value> = list.items.into_iter().filter(|e| is_about(e, about)).collect();
    events.sort_by_key(timestamp);
    Ok((events, list.metadata.resource_version))
}

pub async fn events(
    client: &Client,
    for_object: Option<&str>,
    format: OutputFormat,
    watch: bool,
) -> anyhow::Result<()> {
    let about = match for_object {
        Some(spec) => {
            let (kind, name) =
                spec.split_once('/').ok_or_else(|| crate::Usage("--for takes kind/name, like node/node-1".into()))?;
            Some((kinds::resolve(kind)?.kind, name))
        }
        None => None,
    };
    let (events, revision) = list_events(client, about).await?;
    output::print("Event", &json!({ "kind": "EventList", "items": events }), &events, &format)?;
    if !watch {
        return Ok(());
    }
    let mut changes = client.follow("events", &revision, "");
    loop {
        let change = changes.next().await?;
        if change.type_ != herd_core::api::WatchEventType::Deleted && is_about(&change.object, about) {
            output::print_change("Event", &change.object, &format)?;
        }
    }
}

pub async fn describe(client: &Client, kind: &str, name: &str) -> anyhow::Result<()> {
    let kind = kinds::resolve(kind)?;
    let object = client.get_value(kind.plural, name).await?;
    if let Some(summary) = super::describe::summary(client, kind.kind, name).await? {
        println!("{summary}");
    }
    print!("{}", serde_saphyr::to_string(&object)?);
    let events = if kind.kind == AppClusterSpec::KIND {
        // A cluster's story is mostly its members' (and their Commands'),
        // those removed included.
        let roles: Vec<String> = object
            .pointer("/spec/roles")
            .and_then(Value::as_array)
            .map(|roles| roles.iter().filter_map(|r| r["name"].as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let list = client.list_values("events", "").await?;
        let mut events: Vec<Value> = list.items.into_iter().filter(|e| of_cluster(e, name, &roles)).collect();
        events.sort_by_key(timestamp);
        events
    } else {
        list_events(client, Some((kind.kind, name))).await?.0
    };
    println!("\nEvents:");
    if events.is_empty() {
        println!("  <none>");
    } else {
        println!("{}", output::table("Event", &events, false));
    }
    Ok(())
}
