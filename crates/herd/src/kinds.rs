//! The names users type for kinds: `node`, `nodes`, `no`, `Node`.

use herd_core::kinds::{
    AppClusterSpec, AppSpec, ClusterConfigSpec, CommandSpec, DisruptionBudgetSpec, EventSpec, LeaseSpec, MemberSpec,
    NodeSpec, OperationSpec, ReplicaSpec,
};
use herd_core::{Object, Resource, ValidationErrors};

#[derive(Clone, Copy, Debug)]
pub struct KindName {
    pub kind: &'static str,
    pub plural: &'static str,
    pub short: &'static str,
    /// Reads a manifest as this kind and validates it, as the server will;
    /// returns it with every default filled in.
    pub normalize: fn(serde_json::Value) -> Result<serde_json::Value, ValidationErrors>,
}

fn normalize<S: Resource>(value: serde_json::Value) -> Result<serde_json::Value, ValidationErrors> {
    let object = Object::<S>::from_json_value(value)?;
    object.validate()?;
    Ok(object.to_json_value())
}

fn of<S: Resource>(short: &'static str) -> KindName {
    KindName { kind: S::KIND, plural: S::PLURAL, short, normalize: normalize::<S> }
}

/// What `herd get KIND` takes, for its help: every kind of [`all`] (a
/// test holds the two together).
pub const KINDS_HELP: &str = "The kind: node, clusterconfig, lease, event, replica, command, app, appcluster, member, \
                              disruptionbudget, operation, or all (singular, plural or short name; `herd get` with \
                              no kind lists them)";

pub fn all() -> [KindName; 11] {
    [
        of::<CommandSpec>("cmd"),
        of::<NodeSpec>("no"),
        of::<ClusterConfigSpec>("cc"),
        of::<LeaseSpec>("lease"),
        of::<EventSpec>("ev"),
        of::<ReplicaSpec>("rep"),
        of::<AppSpec>("app"),
        of::<AppClusterSpec>("ac"),
        of::<MemberSpec>("mem"),
        of::<DisruptionBudgetSpec>("budget"),
        of::<OperationSpec>("op"),
    ]
}

pub fn resolve(name: &str) -> anyhow::Result<KindName> {
    let wanted = name.to_ascii_lowercase();
    for kind in all() {
        // The short name in the plural too: `herd get budgets`.
        let short_plural = wanted.strip_suffix('s') == Some(kind.short);
        if short_plural || [kind.kind.to_ascii_lowercase().as_str(), kind.plural, kind.short].contains(&wanted.as_str())
        {
            return Ok(kind);
        }
    }
    let known: Vec<_> = all().iter().map(|k| k.plural).collect();
    Err(crate::Usage(format!("unknown kind {name:?}; known kinds: {} (`herd get` lists them)", known.join(", ")))
        .into())
}

/// The kind named by a manifest's `kind` field (`Node`).
pub fn by_kind(kind: &str) -> Option<KindName> {
    all().into_iter().find(|k| k.kind == kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for name in ["node", "nodes", "no", "Node", "NODES"] {
            assert_eq!(resolve(name).unwrap().plural, "nodes");
        }
        assert_eq!(resolve("cc").unwrap().kind, "ClusterConfig");
        assert!(resolve("pods").unwrap_err().to_string().contains("known kinds: commands, nodes"));
        assert_eq!(resolve("cmd").unwrap().kind, "Command");
        assert_eq!(resolve("appclusters").unwrap().kind, "AppCluster");
        for name in ["budget", "budgets", "disruptionbudgets", "DisruptionBudget"] {
            assert_eq!(resolve(name).unwrap().kind, "DisruptionBudget", "{name}");
        }
        assert_eq!(resolve("mem").unwrap().kind, "Member");
        assert_eq!(resolve("ops").unwrap().kind, "Operation");
    }

    #[test]
    fn the_help_names_every_kind() {
        let help = KINDS_HELP.to_ascii_lowercase();
        for kind in all() {
            assert!(help.contains(&kind.kind.to_ascii_lowercase()), "{} is missing from the help", kind.kind);
        }
    }
}
