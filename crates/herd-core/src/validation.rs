//! Validation errors that name the field path and the reason.
//!
//! Every check in herd reports `spec.role: must be one of ...`, never just
//! "invalid". The server turns a non-empty [`ValidationErrors`] into a 422.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::objects_only::ObjectsOnly;

/// A dotted path to a field, such as `spec.leaderElection.retryPeriod`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldPath(String);

impl FieldPath {
    pub fn root(name: &str) -> Self {
        FieldPath(name.to_string())
    }
    pub fn child(&self, name: &str) -> Self {
        if self.0.is_empty() { FieldPath(name.to_string()) } else { FieldPath(format!("{}.{}", self.0, name)) }
    }
    pub fn key(&self, key: &str) -> Self {
        FieldPath(format!("{}[{}]", self.0, key))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for FieldPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One field and what is wrong with it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

/// Every problem found in one object; empty means valid.
#[derive(Clone, Debug, Default, PartialEq, Eq, thiserror::Error)]
pub struct ValidationErrors {
    pub errors: Vec<FieldError>,
}

impl ValidationErrors {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn single(field: impl Into<String>, reason: impl Into<String>) -> Self {
        let mut errors = Self::new();
        errors.errors.push(FieldError { field: field.into(), reason: reason.into() });
        errors
    }

    pub fn add(&mut self, field: &FieldPath, reason: impl Into<String>) {
        self.errors.push(FieldError { field: field.as_str().to_string(), reason: reason.into() });
    }

    pub fn is_empty(&self) -> bool {
        self.errors.is_empty()
    }

    /// `Ok(())` when nothing was found, else these errors.
    pub fn into_result(self) -> Result<(), ValidationErrors> {
        if self.is_empty() { Ok(()) } else { Err(self) }
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.errors.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{}: {}", e.field, e.reason)?;
        }
        Ok(())
    }
}

/// Reads JSON into `T`; what does not fit is reported at its field path
/// (`spec.role`), or at `body` when the JSON itself is broken.
/// Every struct in it is read from an object only ([`ObjectsOnly`]).
pub fn from_json_slice<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ValidationErrors> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let read = serde_path_to_error::deserialize(ObjectsOnly(&mut deserializer)).map_err(path_error)?;
    deserializer.end().map_err(|e| ValidationErrors::single("body".to_string(), e.to_string()))?;
    Ok(read)
}

/// Like [`from_json_slice`], from an already parsed value.
pub fn from_json_value<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<T, ValidationErrors> {
    serde_path_to_error::deserialize(ObjectsOnly(value)).map_err(path_error)
}

fn path_error(error: serde_path_to_error::Error<serde_json::Error>) -> ValidationErrors {
    let path = error.path().to_string();
    let field = if path == "." || path == "?" { "body".to_string() } else { path };
    ValidationErrors::single(field, error.into_inner().to_string())
}

/// Names of objects, nodes and label values: an RFC 1123 subdomain
/// (lowercase letters, digits, `-` and `.`, starting and ending with a letter
/// or digit, at most 253 characters).
pub fn check_name(path: &FieldPath, name: &str, errors: &mut ValidationErrors) {
    if name.is_empty() {
        errors.add(path, "must not be empty");
        return;
    }
    if name.len() > 253 {
        errors.add(path, format!("must be at most 253 characters, is {}", name.len()));
    }
    let valid_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    if let Some(bad) = name.chars().find(|c| !valid_char(*c)) {
        errors.add(path, format!("may contain only lowercase letters, digits, '-' and '.', found {bad:?}"));
    } else if !name.starts_with(|c: char| c.is_ascii_alphanumeric())
        || !name.ends_with(|c: char| c.is_ascii_alphanumeric())
    {
        errors.add(path, "must start and end with a letter or digit");
    }
}

/// The longest node name: it is also the `herd.io/node` label value of the
/// node's Commands, and label values have at most 63 characters.
pub const MAX_NODE_NAME_LENGTH: usize = 63;

/// A node's name: an object name of at most [`MAX_NODE_NAME_LENGTH`].
pub fn check_node_name(path: &FieldPath, name: &str, errors: &mut ValidationErrors) {
    check_name(path, name, errors);
    if name.len() > MAX_NODE_NAME_LENGTH {
        errors.add(
            path,
            format!(
                "a node name must be at most {MAX_NODE_NAME_LENGTH} characters (it labels the node's Commands), is {}",
                name.len()
            ),
        );
    }
}

/// Environment variables: each name a shell variable name.
pub fn check_env(path: &FieldPath, env: &std::collections::BTreeMap<String, String>, errors: &mut ValidationErrors) {
    for key in env.keys() {
        let valid = !key.is_empty()
            && !key.starts_with(|c: char| c.is_ascii_digit())
            && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            errors.add(&path.key(key), "must be a shell variable name ([A-Za-z_][A-Za-z0-9_]*)");
        }
    }
}

/// A duration between `min` and `max` (both included), named by field.
pub fn check_duration(
    path: &FieldPath,
    value: crate::HumanDuration,
    (min, max): (std::time::Duration, std::time::Duration),
    errors: &mut ValidationErrors,
) {
    if value.get() < min || value.get() > max {
        let (min, max) = (crate::HumanDuration(min), crate::HumanDuration(max));
        errors.add(path, format!("must be from {min} to {max}, is {value}"));
    }
}

/// Names that must each appear once in a list (roles, ports).
pub fn check_unique_names<'a>(
    path: &FieldPath,
    names: impl IntoIterator<Item = &'a str>,
    errors: &mut ValidationErrors,
) {
    let mut seen = std::collections::BTreeSet::new();
    for (i, name) in names.into_iter().enumerate() {
        let field = path.key(&i.to_string()).child("name");
        check_name(&field, name, errors);
        if !seen.insert(name) {
            errors.add(&field, format!("{name:?} is listed twice"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_array_where_an_object_belongs_is_refused_naming_the_field() {
        use crate::kinds::{Member, Node};
        let refused = |errors: ValidationErrors| (errors.errors[0].field.clone(), errors.errors[0].reason.clone());
        // A spec whose every field may be left out, and amounts likewise.
        let node = from_json_value::<Node>(serde_json::json!({"metadata": {"name": "n1"}, "spec": []}));
        let (field, reason) = refused(node.unwrap_err());
        assert_eq!(field, "spec");
        assert!(reason.starts_with("invalid type: sequence, expected"), "{reason}");
        let member = serde_json::json!({"metadata": {"name": "m"}, "spec": {"node": "n1", "resources": [0, 0, 0]}});
        assert_eq!(refused(from_json_value::<Member>(member).unwrap_err()).0, "spec.resources");
        let body = br#"{"metadata": {"name": "n1"}, "status": {"capacity": []}}"#;
        assert_eq!(refused(from_json_slice::<Node>(body).unwrap_err()).0, "status.capacity");
        assert_eq!(refused(from_json_slice::<Node>(b"[]").unwrap_err()).0, "body");
        let node = from_json_slice::<Node>(br#"{"metadata": {"name": "n1"}, "spec": {"unschedulable": true}}"#);
        assert!(node.unwrap().spec.unschedulable, "objects read as before");
        // Flattened into a join (schemathesis found this one).
        let join = |usage: &str| {
            let body = format!(
                r#"{{"nodeName": "n1", "agentBootId": "b", "members": [{{"name": "m", "wanted": true, "running": true, "usage": {usage}}}]}}"#
            );
            from_json_slice::<crate::api::JoinRequest>(body.as_bytes())
        };
        assert!(join(r#"{"memory": "1Mi"}"#).is_ok());
        assert!(refused(join("[null, null]").unwrap_err()).1.starts_with("invalid type: sequence"));
    }

    fn name_errors(name: &str) -> ValidationErrors {
        let mut errors = ValidationErrors::new();
        check_name(&FieldPath::root("metadata").child("name"), name, &mut errors);
        errors
    }

    #[test]
    fn names() {
        assert!(name_errors("node-1").is_empty());
        assert!(name_errors("db.example").is_empty());
        assert_eq!(
            name_errors("Node_1").to_string(),
            "metadata.name: may contain only lowercase letters, digits, '-' and '.', found 'N'"
        );
        assert_eq!(name_errors("-a").to_string(), "metadata.name: must start and end with a letter or digit");
        assert_eq!(name_errors("").to_string(), "metadata.name: must not be empty");
    }
}
