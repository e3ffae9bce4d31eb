//! The generic object envelope and the trait each kind implements.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::API_VERSION;
use crate::descriptor::{Access, Column, Descriptor};
use crate::meta::ObjectMeta;
use crate::validation::{FieldPath, ValidationErrors};

/// What every spec and status type is: (de)serialisable, described by a
/// schema, comparable, shareable between tasks.
pub trait Data:
    Serialize
    + DeserializeOwned
    + schemars::JsonSchema
    + Clone
    + Default
    + PartialEq
    + std::fmt::Debug
    + Send
    + Sync
    + 'static
{
}

impl<T> Data for T where
    T: Serialize
        + DeserializeOwned
        + schemars::JsonSchema
        + Clone
        + Default
        + PartialEq
        + std::fmt::Debug
        + Send
        + Sync
        + 'static
{
}

/// What a kind of resource is: its names, its status type and its checks.
/// Implemented by the kind's spec type.
pub trait Resource: Data {
    /// `Node`, `ClusterConfig`, ...
    const KIND: &'static str;
    /// The path segment in `/api/v1/<plural>`.
    const PLURAL: &'static str;
    /// Whether the kind has a status written through the status subresource.
    const HAS_STATUS: bool = true;
    /// The short name `herd get` also takes (`no` for nodes).
    const SHORT: &'static str;
    /// Part of the configuration master candidates keep (an intent kind).
    const REPLICATED: bool = false;
    /// Who besides an admin may touch its objects.
    const ACCESS: Access = Access::ADMIN;
    /// The columns of its table (`herd get`, the dashboard).
    const COLUMNS: &'static [Column] = crate::descriptor::DEFAULT_COLUMNS;

    /// Everything the rest of herd knows of the kind.
    fn descriptor() -> Descriptor {
        Descriptor {
            kind: Self::KIND,
            plural: Self::PLURAL,
            short: Self::SHORT,
            has_status: Self::HAS_STATUS,
            replicated: Self::REPLICATED,
            access: Self::ACCESS,
            columns: Self::COLUMNS,
        }
    }

    type Status: Data;

    /// Checks the spec; `path` is `spec`.
    fn validate_spec(&self, _path: &FieldPath, _errors: &mut ValidationErrors) {}

    /// Checks the object's name beyond the generic rules (singletons, say).
    fn validate_name(_name: &str, _errors: &mut ValidationErrors) {}

    /// Checks that the name goes with the spec (a Member's is its slot's).
    fn validate_name_for_spec(&self, _name: &str, _errors: &mut ValidationErrors) {}

    /// Labels the server sets from the spec (Commands by node, Members by
    /// cluster and role): a client may leave them out, not change them.
    fn owned_labels(&self) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// Why objects of this kind cannot be deleted (None: they can).
    fn delete_refusal() -> Option<&'static str> {
        None
    }

    /// Checks a spec change against the stored spec (immutable fields).
    fn validate_spec_update(&self, _old: &Self, _path: &FieldPath, _errors: &mut ValidationErrors) {}
}

/// An object of kind `S`: apiVersion, kind, metadata, spec and status.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields, bound = "")]
#[schemars(bound = "S: Resource", rename = "Object_for_{S}")]
pub struct Object<S: Resource> {
    #[serde(default = "default_api_version")]
    pub api_version: String,
    #[serde(default = "kind_of::<S>")]
    pub kind: String,
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: S,
    #[serde(default, skip_serializing_if = "is_default")]
    pub status: S::Status,
}

fn default_api_version() -> String {
    API_VERSION.to_string()
}

fn kind_of<S: Resource>() -> String {
    S::KIND.to_string()
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl<S: Resource> Object<S> {
    pub fn new(name: impl Into<String>, spec: S) -> Self {
        Object {
            api_version: default_api_version(),
            kind: S::KIND.to_string(),
            metadata: ObjectMeta::named(name),
            spec,
            status: S::Status::default(),
        }
    }

    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    /// Every check on the object as a whole: envelope, metadata and spec.
    pub fn validate(&self) -> Result<(), ValidationErrors> {
        let mut errors = ValidationErrors::new();
        if self.api_version != API_VERSION {
            errors.add(&FieldPath::root("apiVersion"), format!("must be {API_VERSION:?}, got {:?}", self.api_version));
        }
        if self.kind != S::KIND {
            errors.add(&FieldPath::root("kind"), format!("must be {:?}, got {:?}", S::KIND, self.kind));
        }
        self.metadata.validate(&FieldPath::root("metadata"), &mut errors);
        S::validate_name(&self.metadata.name, &mut errors);
        self.spec.validate_name_for_spec(&self.metadata.name, &mut errors);
        self.spec.validate_spec(&FieldPath::root("spec"), &mut errors);
        errors.into_result()
    }

    /// Reads an object from JSON; a malformed body names the field at fault.
    pub fn from_json_value(value: serde_json::Value) -> Result<Self, ValidationErrors> {
        crate::validation::from_json_value(value)
    }

    pub fn to_json_value(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("herd objects always serialise to JSON")
    }
}
