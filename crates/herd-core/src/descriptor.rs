//! What herd needs to know of a kind beyond its Rust type, declared once
//! on its [`crate::Resource`] impl: the names users type, whether it is
//! part of the configuration master candidates replicate, who besides an
//! admin may read or write it, and the columns of its table. The server's
//! registry, restore and authorization, the CLI's kind names and tables,
//! the configuration's kinds and the dashboard (which is served the
//! descriptors) are all derived from [`crate::kinds::descriptors`].

use serde::Serialize;

/// A kind, as everything but its own code sees it.
#[derive(Clone, Copy, Debug, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    /// `Node`.
    pub kind: &'static str,
    /// `nodes`: the path segment in `/api/v1/<plural>`.
    pub plural: &'static str,
    /// `no`: what `herd get` also takes.
    pub short: &'static str,
    pub has_status: bool,
    /// Part of the configuration master candidates keep (an intent kind).
    pub replicated: bool,
    pub access: Access,
    pub columns: &'static [Column],
}

/// Who besides an admin may touch objects of a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Access {
    pub node: NodeAccess,
    /// A viewer token reads them (it never writes).
    pub viewer_reads: bool,
}

impl Access {
    /// Admins do everything, viewers read, nodes nothing.
    pub const ADMIN: Access = Access { node: NodeAccess::None, viewer_reads: true };
}

/// What a node's own token may do with objects of a kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum NodeAccess {
    /// Nothing.
    None,
    /// Get any one object (the ClusterConfig a node follows).
    Get,
    /// Its own object only: get it, write its status, heartbeat, read its
    /// Commands (the Node; Kubernetes' NodeRestriction).
    Own,
}

/// One column of a kind's table.
#[derive(Clone, Copy, Debug, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Column {
    pub header: &'static str,
    /// Shown only in the wide table (`-o wide`).
    pub wide: bool,
    pub cell: Cell,
}

impl Column {
    pub const fn of(header: &'static str, cell: Cell) -> Column {
        Column { header, wide: false, cell }
    }

    pub const fn wide(header: &'static str, cell: Cell) -> Column {
        Column { header, wide: true, cell }
    }

    pub const NAME: Column = Column::of("NAME", Cell::Text { path: "/metadata/name" });
    pub const AGE: Column = Column::of("AGE", Cell::Age { path: "/metadata/creationTimestamp" });
    pub const LABELS: Column = Column::wide("LABELS", Cell::Labels);
}

/// The columns of a kind that declares none: its name, age and labels.
pub const DEFAULT_COLUMNS: &[Column] = &[Column::NAME, Column::AGE, Column::LABELS];

/// What a cell shows of an object (as JSON; paths are JSON pointers).
/// The CLI and the dashboard each render every variant; a new kind made
/// of the plain ones needs neither changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(tag = "type", rename_all = "camelCase", rename_all_fields = "camelCase")]
pub enum Cell {
    /// The value at `path` as text; nothing when absent.
    Text { path: &'static str },
    /// The value at `path`, or `otherwise` when absent or empty.
    TextOr { path: &'static str, otherwise: &'static str },
    /// The first of `paths` that holds a value.
    FirstOf { paths: &'static [&'static str] },
    /// A count, 0 when absent.
    Count { path: &'static str },
    /// Two counts: `a/b`.
    Ratio { a: &'static str, b: &'static str },
    /// Two values: `{a}{between}{b}`.
    Pair { a: &'static str, between: &'static str, b: &'static str },
    /// A number of seconds: `15s`.
    Seconds { path: &'static str },
    /// How long ago the time at `path` was.
    Age { path: &'static str },
    /// `yes` when the value at `path` is true, else `no`.
    YesNo { path: &'static str },
    /// `field` of each element of the array at `path`, joined by commas.
    Each { path: &'static str, field: &'static str },
    /// `key=value` of each element of the array at `path`.
    EachPair { path: &'static str, key: &'static str, value: &'static str },
    /// The keys whose value is true in the object at `path` (`-`: none).
    TrueKeys { path: &'static str },
    /// The object's labels, `key=value` joined by commas.
    Labels,
    /// A Node's readiness, with `SchedulingDisabled` when cordoned.
    NodeStatus,
    /// A Node's role, with `master` for the master's.
    NodeRole,
    /// A Member's state, with its crash loop when it has one.
    MemberState,
    /// What an Event is about: `kind/name`, the kind in lower case.
    EventObject,
    /// What an Operation does: `Drain node`, `Restart cluster/role`.
    OperationAction,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_descriptor_reads_as_the_dashboard_takes_it() {
        let column = Column::of("HEALTHY", Cell::Ratio { a: "/status/currentHealthy", b: "/status/expectedMembers" });
        assert_eq!(
            serde_json::to_value(column).unwrap(),
            serde_json::json!({"header": "HEALTHY", "wide": false,
                "cell": {"type": "ratio", "a": "/status/currentHealthy", "b": "/status/expectedMembers"}})
        );
        assert_eq!(serde_json::to_value(Cell::NodeStatus).unwrap(), serde_json::json!({"type": "nodeStatus"}));
    }
}
