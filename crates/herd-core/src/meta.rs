//! Kubernetes-style object metadata shared by every kind.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::labels::{self, Labels};
use crate::time::Timestamp;
use crate::validation::{self, FieldPath, ValidationErrors};

/// Metadata carried by every object. Fields other than name, labels and
/// annotations are owned by the server: what a client sends is overwritten.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ObjectMeta {
    #[schemars(regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"), length(min = 1, max = 253))]
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<String>,
    /// The store revision of the last write to this object, as a decimal
    /// string. Sent back on update; a stale value gets 409.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_version: Option<String>,
    /// Bumped by the server whenever `spec` changes.
    #[serde(default)]
    pub generation: i64,
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub labels: Labels,
    #[serde(default, skip_serializing_if = "Labels::is_empty")]
    pub annotations: Labels,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_timestamp: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_timestamp: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub owner_references: Vec<OwnerReference>,
}

/// Points at the object that owns this one; owned objects are deleted with
/// their owner.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct OwnerReference {
    pub kind: String,
    pub name: String,
    pub uid: String,
}

impl ObjectMeta {
    pub fn named(name: impl Into<String>) -> Self {
        ObjectMeta { name: name.into(), ..Default::default() }
    }

    /// The resource version as the store revision it encodes.
    pub fn revision(&self) -> Result<Option<u64>, ValidationErrors> {
        match &self.resource_version {
            None => Ok(None),
            Some(text) => text.parse::<u64>().map(Some).map_err(|_| {
                ValidationErrors::single(
                    "metadata.resourceVersion",
                    format!("{text:?} is not a resource version (a decimal number)"),
                )
            }),
        }
    }

    pub fn validate(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        validation::check_name(&path.child("name"), &self.name, errors);
        labels::check_labels(&path.child("labels"), &self.labels, errors);
        labels::check_annotations(&path.child("annotations"), &self.annotations, errors);
        for (i, owner) in self.owner_references.iter().enumerate() {
            let p = path.child("ownerReferences").key(&i.to_string());
            if owner.kind.is_empty() {
                errors.add(&p.child("kind"), "must not be empty");
            }
            validation::check_name(&p.child("name"), &owner.name, errors);
        }
    }
}
