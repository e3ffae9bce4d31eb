//! The kinds the API serves, each bound to its typed rules. Handlers work
//! on JSON; the [`KindOps`] of a kind parses it into the typed object, so
//! that validation and lifecycle come from `herd-core`.

use std::collections::BTreeMap;
use std::marker::PhantomData;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use herd_core::kinds::{AppClusterSpec, AppRevisionSpec, AppSpec, CommandSpec, KindVisitor, NodeSpec, OperationSpec};
use herd_core::{Object, Resource, ValidationErrors};
use schemars::{Schema, SchemaGenerator};
use serde_json::Value;

use crate::error::ApiError;
use crate::objects::{Objects, Part};

/// A kind's names.
#[derive(Clone, Copy, Debug)]
pub struct KindInfo {
    pub kind: &'static str,
    pub plural: &'static str,
    pub has_status: bool,
    /// Why objects of the kind cannot be deleted, if they cannot.
    pub delete_refusal: Option<&'static str>,
}

/// The typed operations of one kind, reachable from JSON.
#[async_trait]
pub trait KindOps: Send + Sync {
    fn info(&self) -> KindInfo;
    async fn create(&self, objects: &Objects, body: Value, dry_run: bool) -> Result<Value, ApiError>;
    /// Replaces metadata and spec, or the status, of object `name`.
    async fn replace(
        &self,
        objects: &Objects,
        name: &str,
        body: Value,
        part: Part,
        dry_run: bool,
    ) -> Result<Value, ApiError>;
    fn schema(&self, generator: &mut SchemaGenerator) -> Schema;
}

struct Typed<S>(PhantomData<fn() -> S>);

fn parse<S: Resource>(body: Value, url_name: Option<&str>) -> Result<Object<S>, ApiError> {
    let body_name = body.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default().to_string();
    let object = Object::<S>::from_json_value(body).map_err(|e| ApiError::invalid(S::KIND, &body_name, e))?;
    if let Some(url_name) = url_name
        && url_name != object.metadata.name
    {
        let errors = ValidationErrors::single(
            "metadata.name",
            format!("{:?} does not match the name in the URL, {url_name:?}", object.metadata.name),
        );
        return Err(ApiError::invalid(S::KIND, url_name, errors));
    }
    Ok(object)
}

#[async_trait]
impl<S: Resource> KindOps for Typed<S> {
    fn info(&self) -> KindInfo {
        KindInfo { kind: S::KIND, plural: S::PLURAL, has_status: S::HAS_STATUS, delete_refusal: S::delete_refusal() }
    }

    async fn create(&self, objects: &Objects, body: Value, dry_run: bool) -> Result<Value, ApiError> {
        let object = parse::<S>(body, None)?;
        Ok(objects.create(object, false, dry_run).await?.to_json_value())
    }

    async fn replace(
        &self,
        objects: &Objects,
        name: &str,
        body: Value,
        part: Part,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        let object = parse::<S>(body, Some(name))?;
        Ok(objects.write_part(object, part, dry_run).await?.to_json_value())
    }

    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        generator.subschema_for::<Object<S>>()
    }
}

/// Commands are admitted first: labelled with their node, and refused
/// when an unsettled Command holds what they would hold.
struct CommandKind;

#[async_trait]
impl KindOps for CommandKind {
    fn info(&self) -> KindInfo {
        Typed::<CommandSpec>(PhantomData).info()
    }

    async fn create(&self, objects: &Objects, body: Value, dry_run: bool) -> Result<Value, ApiError> {
        let object = parse::<CommandSpec>(body, None)?;
        object.validate().map_err(|e| ApiError::invalid(CommandSpec::KIND, &object.metadata.name, e))?;
        Ok(crate::commands::create(objects, object, dry_run).await?.to_json_value())
    }

    async fn replace(
        &self,
        objects: &Objects,
        name: &str,
        body: Value,
        part: Part,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        Typed::<CommandSpec>(PhantomData).replace(objects, name, body, part, dry_run).await
    }

    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        Typed::<CommandSpec>(PhantomData).schema(generator)
    }
}

/// Apps are written with their revisions (`app_revisions.rs`).
struct AppKind;

#[async_trait]
impl KindOps for AppKind {
    fn info(&self) -> KindInfo {
        Typed::<AppSpec>(PhantomData).info()
    }

    async fn create(&self, objects: &Objects, body: Value, dry_run: bool) -> Result<Value, ApiError> {
        let app = parse::<AppSpec>(body, None)?;
        Ok(crate::app_revisions::write(objects, app, None, dry_run).await?.to_json_value())
    }

    async fn replace(
        &self,
        objects: &Objects,
        name: &str,
        body: Value,
        part: Part,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if matches!(part, Part::Status) {
            return Typed::<AppSpec>(PhantomData).replace(objects, name, body, part, dry_run).await;
        }
        let app = parse::<AppSpec>(body, Some(name))?;
        let old = objects.require::<AppSpec>(name).await?;
        Ok(crate::app_revisions::write(objects, app, Some(&old), dry_run).await?.to_json_value())
    }

    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        Typed::<AppSpec>(PhantomData).schema(generator)
    }
}

/// AppRevisions are herd's to write, with their App's changes.
struct RevisionKind;

#[async_trait]
impl KindOps for RevisionKind {
    fn info(&self) -> KindInfo {
        Typed::<AppRevisionSpec>(PhantomData).info()
    }

    async fn create(&self, _objects: &Objects, _body: Value, _dry_run: bool) -> Result<Value, ApiError> {
        Err(written_by_herd())
    }

    async fn replace(&self, _: &Objects, _: &str, _: Value, _: Part, _: bool) -> Result<Value, ApiError> {
        Err(written_by_herd())
    }

    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        Typed::<AppRevisionSpec>(PhantomData).schema(generator)
    }
}

fn written_by_herd() -> ApiError {
    ApiError::MethodNotAllowed(
        "AppRevisions are written by herd with each change to their App's spec; they are never created or changed \
         by hand"
            .into(),
    )
}

/// Checks a create or a spec replace against the rest of the store
/// before it is written (async: it reads other objects).
type Admit<S> = for<'a> fn(&'a Objects, &'a Object<S>) -> BoxFuture<'a, Result<(), ApiError>>;

/// A kind whose creates or spec replaces are admitted first: AppClusters
/// (a spec change waits for a reconcile pass over the previous one and
/// for pending notifies), Nodes (a role change meets the pool's rules) and
/// Operations (what a new one names exists and is not worked on already).
struct Admitted<S: Resource> {
    on_create: Option<Admit<S>>,
    on_replace: Option<Admit<S>>,
}

#[async_trait]
impl<S: Resource> KindOps for Admitted<S> {
    fn info(&self) -> KindInfo {
        Typed::<S>(PhantomData).info()
    }

    async fn create(&self, objects: &Objects, body: Value, dry_run: bool) -> Result<Value, ApiError> {
        if let Some(admit) = self.on_create {
            admit(objects, &parse::<S>(body.clone(), None)?).await?;
        }
        Typed::<S>(PhantomData).create(objects, body, dry_run).await
    }

    async fn replace(
        &self,
        objects: &Objects,
        name: &str,
        body: Value,
        part: Part,
        dry_run: bool,
    ) -> Result<Value, ApiError> {
        if let (Part::Spec, Some(admit)) = (part, self.on_replace) {
            admit(objects, &parse::<S>(body.clone(), Some(name))?).await?;
        }
        Typed::<S>(PhantomData).replace(objects, name, body, part, dry_run).await
    }

    fn schema(&self, generator: &mut SchemaGenerator) -> Schema {
        Typed::<S>(PhantomData).schema(generator)
    }
}

/// Every kind the server serves, by plural.
pub struct Registry {
    kinds: BTreeMap<&'static str, Box<dyn KindOps>>,
}

impl Registry {
    /// Every kind (`herd_core::kinds::visit`), typed; a few admitted first.
    pub fn standard() -> Self {
        struct Add(Registry);
        impl KindVisitor for Add {
            fn visit<S: Resource>(&mut self) {
                self.0.add::<S>();
            }
        }
        let mut all = Add(Registry { kinds: BTreeMap::new() });
        herd_core::kinds::visit(&mut all);
        let mut registry = all.0;
        let admit_node: Admit<NodeSpec> = |objects, node| Box::pin(crate::node_roles::admit_replace(objects, node));
        registry.admitted(Admitted { on_create: None, on_replace: Some(admit_node) });
        let admit_cluster: Admit<AppClusterSpec> =
            |objects, cluster| Box::pin(crate::app_clusters::admit_replace(objects, cluster));
        let admit_new_cluster: Admit<AppClusterSpec> =
            |objects, cluster| Box::pin(crate::app_clusters::admit_create(objects, cluster));
        registry.admitted(Admitted { on_create: Some(admit_new_cluster), on_replace: Some(admit_cluster) });
        let admit_operation: Admit<OperationSpec> =
            |objects, operation| Box::pin(crate::operations::admit(objects, operation));
        registry.admitted(Admitted { on_create: Some(admit_operation), on_replace: None });
        registry.kinds.insert(CommandSpec::PLURAL, Box::new(CommandKind));
        registry.kinds.insert(AppSpec::PLURAL, Box::new(AppKind));
        registry.kinds.insert(AppRevisionSpec::PLURAL, Box::new(RevisionKind));
        registry
    }

    fn admitted<S: Resource>(&mut self, kind: Admitted<S>) {
        self.kinds.insert(S::PLURAL, Box::new(kind));
    }

    fn add<S: Resource>(&mut self) {
        self.kinds.insert(S::PLURAL, Box::new(Typed::<S>(PhantomData)));
    }

    pub fn get(&self, plural: &str) -> Result<&dyn KindOps, ApiError> {
        self.kinds.get(plural).map(|k| k.as_ref()).ok_or_else(|| {
            let known: Vec<_> = self.kinds.keys().copied().collect();
            ApiError::NotFound { kind: "resource type".into(), name: format!("{plural} (known: {})", known.join(", ")) }
        })
    }

    pub fn iter(&self) -> impl Iterator<Item = &dyn KindOps> {
        self.kinds.values().map(|k| k.as_ref())
    }
}
