//! The names users type for kinds: `node`, `nodes`, `no`, `Node`.

use herd_core::kinds::KindVisitor;
use herd_core::{Object, Resource, ValidationErrors};

#[derive(Clone, Copy, Debug)]
pub struct KindName {
    pub kind: &'static str,
    pub plural: &'static str,
    pub short: &'static str,
    /// Reads a manifest as this kind and validates it, as the server will;
    /// returns it with every default filled in.
    pub normalize: fn(&str) -> Result<serde_json::Value, Manifest>,
}

/// Why a manifest is not an object of its kind.
#[derive(Debug)]
pub enum Manifest {
    /// It does not read as the kind: the field at fault, the line (within
    /// the document) the reader stopped at, and why.
    Unreadable { field: String, line: Option<u64>, reason: String },
    /// It reads, and breaks the kind's rules.
    Invalid(ValidationErrors),
}

/// Reads a manifest's YAML (or JSON) text straight into the typed object,
/// as STYLE asks (no untyped tree in between: YAML 1.1's `n`, `no`, `on`
/// stay strings where the kind wants a string), validates it as the
/// server will, and returns it with every default filled in.
fn normalize<S: Resource>(text: &str) -> Result<serde_json::Value, Manifest> {
    let mut field = String::new();
    let read = serde_saphyr::with_deserializer_from_str(text, |deserializer| {
        serde_path_to_error::deserialize::<_, Object<S>>(deserializer).map_err(|error| {
            field = error.path().to_string();
            error.into_inner()
        })
    });
    let object = read.map_err(|error| {
        let line = error.location().map(|l| l.line()).filter(|l| *l > 0);
        // Its words without where (`at line 7, column 34`, within the
        // document): the caller says where in the file.
        let reason = error.without_snippet().to_string();
        let reason = reason.rsplit_once(" at line ").map_or(reason.as_str(), |(words, _)| words).to_string();
        let field = if field.is_empty() || field == "." || field == "?" { "body".to_string() } else { field };
        Manifest::Unreadable { field, line, reason }
    })?;
    object.validate().map_err(Manifest::Invalid)?;
    Ok(object.to_json_value())
}

/// What `herd get` takes, for its help: every kind of [`all`] (a test
/// holds the two together).
pub const KINDS_HELP: &str = "The kind: node, clusterconfig, lease, event, replica, command, app, apprevision, appcluster, member, \
                              disruptionbudget, operation, or all (singular, plural or short name; `herd get` with \
                              no kind lists them)";

/// Every kind (`herd_core::kinds::visit`), with its names and reader.
pub fn all() -> Vec<KindName> {
    struct Names(Vec<KindName>);
    impl KindVisitor for Names {
        fn visit<S: Resource>(&mut self) {
            self.0.push(KindName { kind: S::KIND, plural: S::PLURAL, short: S::SHORT, normalize: normalize::<S> });
        }
    }
    let mut names = Names(Vec::new());
    herd_core::kinds::visit(&mut names);
    names.0
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
