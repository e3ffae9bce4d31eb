//! `AppRevision`: what an App said at one of its generations, kept as the
//! server wrote it with the App's change (`<app>-<revision>`, the revision
//! being the App's generation). Immutable: a revision is never changed,
//! and goes only with its App or when herd prunes it. [`changed_fields`]
//! says what one revision changed from another (`herd app history`).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::NoStatus;
use super::app::AppSpec;
use crate::descriptor::{Cell, Column};
use crate::resource::{Object, Resource};
use crate::validation::{FieldPath, ValidationErrors};

pub type AppRevision = Object<AppRevisionSpec>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AppRevisionSpec {
    /// The App it is a revision of.
    pub app: String,
    /// The App's generation it was.
    pub revision: i64,
    /// The App's spec then.
    pub app_spec: AppSpec,
}

/// The name of revision `revision` of App `app`.
pub fn revision_name(app: &str, revision: i64) -> String {
    format!("{app}-{revision}")
}

impl Resource for AppRevisionSpec {
    const KIND: &'static str = "AppRevision";
    const PLURAL: &'static str = "apprevisions";
    const SHORT: &'static str = "apprev";
    /// Clusters pinned to a revision, and members that run one, need it
    /// after a master candidate took over.
    const REPLICATED: bool = true;
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("APP", Cell::Text { path: "/spec/app" }),
        Column::of("REVISION", Cell::Text { path: "/spec/revision" }),
        Column::AGE,
    ];
    const HAS_STATUS: bool = false;
    type Status = NoStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self.revision < 1 {
            errors.add(&path.child("revision"), "must be at least 1 (an App's generation)");
        }
        self.app_spec.validate_spec(&path.child("appSpec"), errors);
    }

    fn validate_name_for_spec(&self, name: &str, errors: &mut ValidationErrors) {
        let wanted = revision_name(&self.app, self.revision);
        if name != wanted {
            errors.add(&FieldPath::root("metadata").child("name"), format!("must be {wanted:?} (`<app>-<revision>`)"));
        }
    }

    fn delete_refusal() -> Option<&'static str> {
        Some("an App's revisions go with the App, or when herd keeps no more of them")
    }

    fn validate_spec_update(&self, old: &Self, path: &FieldPath, errors: &mut ValidationErrors) {
        if self != old {
            errors.add(path, "a revision never changes");
        }
    }
}

/// The fields `new` changed from `old`, as paths (`roles[0].run.command`),
/// in order; a list that grew or shrank is one change at the list.
pub fn changed_fields(old: &AppSpec, new: &AppSpec) -> Vec<String> {
    let (old, new) = (serde_json::to_value(old).unwrap_or_default(), serde_json::to_value(new).unwrap_or_default());
    let mut changed = Vec::new();
    walk(&old, &new, String::new(), &mut changed);
    changed
}

fn walk(old: &serde_json::Value, new: &serde_json::Value, path: String, changed: &mut Vec<String>) {
    use serde_json::Value;
    let at = |key: &str| if path.is_empty() { key.to_string() } else { format!("{path}.{key}") };
    match (old, new) {
        (Value::Object(old), Value::Object(new)) => {
            let keys: std::collections::BTreeSet<&String> = old.keys().chain(new.keys()).collect();
            for key in keys {
                let none = Value::Null;
                walk(old.get(key).unwrap_or(&none), new.get(key).unwrap_or(&none), at(key), changed);
            }
        }
        (Value::Array(old_items), Value::Array(new_items)) if old_items.len() == new_items.len() => {
            for (i, (old, new)) in old_items.iter().zip(new_items).enumerate() {
                walk(old, new, format!("{path}[{i}]"), changed);
            }
        }
        (old, new) if old != new => changed.push(if path.is_empty() { "spec".into() } else { path }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn app(command: &str, description: Option<&str>) -> AppSpec {
        let mut spec: AppSpec = serde_json::from_value(serde_json::json!({
            "roles": [{"name": "db", "run": {"command": [command]}}]
        }))
        .unwrap();
        spec.description = description.unwrap_or_default().to_string();
        spec
    }

    #[test]
    fn what_a_revision_changed_is_said_field_by_field() {
        assert!(changed_fields(&app("etcd", None), &app("etcd", None)).is_empty());
        assert_eq!(changed_fields(&app("etcd", None), &app("etcd-3.6", None)), ["roles[0].run.command[0]"]);
        assert_eq!(
            changed_fields(&app("etcd", None), &app("etcd-3.6", Some("v2"))),
            ["description", "roles[0].run.command[0]"]
        );
        let mut two_roles = app("etcd", None);
        two_roles.roles.push(two_roles.roles[0].clone());
        assert_eq!(changed_fields(&app("etcd", None), &two_roles), ["roles"]);
    }

    #[test]
    fn a_revision_is_named_for_its_app_and_never_changes() {
        let revision = AppRevision::new(
            "etcd-2",
            AppRevisionSpec { app: "etcd".into(), revision: 2, app_spec: app("etcd", None) },
        );
        assert!(revision.validate().is_ok(), "{:?}", revision.validate());
        let misnamed = AppRevision { metadata: crate::meta::ObjectMeta::named("etcd-3"), ..revision.clone() };
        assert!(misnamed.validate().unwrap_err().to_string().contains("must be \"etcd-2\""));
        let mut errors = ValidationErrors::new();
        let changed = AppRevisionSpec { app_spec: app("etcd-3.6", None), ..revision.spec.clone() };
        changed.validate_spec_update(&revision.spec, &FieldPath::root("spec"), &mut errors);
        assert!(!errors.errors.is_empty());
        // An App's name leaves room for its revisions'.
        let longest = crate::kinds::app::MAX_APP_NAME_LENGTH;
        let mut errors = ValidationErrors::new();
        AppSpec::validate_name(&"a".repeat(longest), &mut errors);
        assert!(errors.errors.is_empty());
        let name = format!("{}-{}", "a".repeat(longest), i64::MAX);
        assert!(
            AppRevision::new(&name, AppRevisionSpec { app: "a".repeat(longest), revision: i64::MAX, ..revision.spec })
                .validate()
                .is_ok_and(|()| name.len() == 253)
        );
        AppSpec::validate_name(&"a".repeat(longest + 1), &mut errors);
        assert!(errors.to_string().contains("at most 233 characters"), "{errors}");
    }
}
