//! `DisruptionBudget`: what an app declares about itself (Kubernetes'
//! PodDisruptionBudget): "of the members this selector picks,
//! always keep at least N healthy" (`minAvailable`), or "never have more
//! than N of them down" (`maxUnavailable`). Voluntary disruptions (an
//! eviction, a drain, a rolling restart) ask it first; crashes cannot be
//! stopped and are only counted. The status is the leader's count, from
//! which an eviction is decided (`crate::disruption`).

use crate::descriptor::{Cell, Column};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::labels::LabelSelector;
use crate::resource::{Object, Resource};
use crate::time::Timestamp;
use crate::validation::{FieldPath, ValidationErrors};

pub type DisruptionBudget = Object<DisruptionBudgetSpec>;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DisruptionBudgetSpec {
    /// The members it covers, by their labels (`herd.io/cluster=etcd`,
    /// `herd.io/role in (primary,replica)`). Must not be empty.
    pub selector: String,
    /// At least this many (or this share, rounded up) stay healthy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<Amount>,
    /// At most this many (or this share, rounded up) are down at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<Amount>,
    /// Whether a member that is not healthy may be evicted while the
    /// budget itself is short.
    #[serde(default)]
    pub unhealthy_eviction_policy: UnhealthyEvictionPolicy,
}

/// A count of members, or a percentage of the members expected (`34%`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Amount {
    Count(u32),
    Percent(u8),
}

/// Kubernetes' `unhealthyPodEvictionPolicy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum UnhealthyEvictionPolicy {
    /// A member that is not healthy may be evicted only while the budget
    /// holds (as many healthy as desired): evicting it cannot make things
    /// worse then, and while the budget is short the app may be recovering.
    #[default]
    IfHealthyBudget,
    /// A member that is not healthy may always be evicted (it adds nothing
    /// to availability): what a drain blocked by a stuck member wants.
    AlwaysAllow,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DisruptionBudgetStatus {
    /// The generation of the spec this status was counted for; evictions
    /// are refused while it lags.
    #[serde(default)]
    pub observed_generation: i64,
    /// Selected members that are ready and not approved for disruption.
    #[serde(default)]
    pub current_healthy: u32,
    #[serde(default)]
    pub desired_healthy: u32,
    /// Selected members that are not being removed by their cluster.
    #[serde(default)]
    pub expected_members: u32,
    /// How many more evictions may be approved now (0 when no member is
    /// expected: a budget fails closed).
    #[serde(default)]
    pub disruptions_allowed: u32,
    /// Members approved for eviction and not yet gone, with when.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub disrupted_members: BTreeMap<String, Timestamp>,
    /// Selected members that are not healthy, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy: Vec<UnhealthyMember>,
    /// When the counts were last taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counted_at: Option<Timestamp>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnhealthyMember {
    pub name: String,
    /// "creating", "configError", "not running (terminated)", ...
    pub reason: String,
}

impl Amount {
    /// The number this amount stands for out of `expected` members;
    /// percentages round up, as Kubernetes rounds them.
    pub fn of(self, expected: u32) -> u32 {
        match self {
            Amount::Count(count) => count,
            Amount::Percent(percent) => (u64::from(expected) * u64::from(percent)).div_ceil(100) as u32,
        }
    }

    fn parse_percent(text: &str) -> Option<Amount> {
        let digits = text.strip_suffix('%')?;
        let canonical = !digits.is_empty()
            && digits.len() <= 3
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        let percent: u8 = digits.parse().ok().filter(|p| canonical && *p <= 100)?;
        Some(Amount::Percent(percent))
    }
}

impl fmt::Display for Amount {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Amount::Count(count) => write!(f, "{count}"),
            Amount::Percent(percent) => write!(f, "{percent}%"),
        }
    }
}

impl Serialize for Amount {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Amount::Count(count) => serializer.serialize_u32(*count),
            Amount::Percent(_) => serializer.collect_str(self),
        }
    }
}

impl<'de> Deserialize<'de> for Amount {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Amount;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a whole number of members, or a percentage from 0% to 100% such as \"34%\"")
            }
            fn visit_u64<E: serde::de::Error>(self, value: u64) -> Result<Amount, E> {
                u32::try_from(value).map(Amount::Count).map_err(|_| E::custom(format!("{value} members is too many")))
            }
            fn visit_i64<E: serde::de::Error>(self, value: i64) -> Result<Amount, E> {
                match u64::try_from(value) {
                    Ok(value) => self.visit_u64(value),
                    Err(_) => Err(E::custom(format!("{value} is negative: a count of members is 0 or more"))),
                }
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Amount, E> {
                Amount::parse_percent(text).ok_or_else(|| {
                    E::custom(format!("{text:?} is not a percentage from 0% to 100% (a number, then %, like \"34%\")"))
                })
            }
        }
        deserializer.deserialize_any(Visitor)
    }
}

impl JsonSchema for Amount {
    fn schema_name() -> Cow<'static, str> {
        "Amount".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "a number of members, or a percentage of those expected (rounded up)",
            "anyOf": [
                { "type": "integer", "minimum": 0, "maximum": u32::MAX },
                { "type": "string", "pattern": "^(100|[1-9]?[0-9])%$" }
            ]
        })
    }
}

impl DisruptionBudgetSpec {
    /// The parsed selector; None if the stored one does not parse (it was
    /// checked when written), and then the budget selects nothing and so
    /// allows nothing.
    pub fn label_selector(&self) -> Option<LabelSelector> {
        LabelSelector::parse(&self.selector).ok()
    }
}

impl Resource for DisruptionBudgetSpec {
    const KIND: &'static str = "DisruptionBudget";
    const PLURAL: &'static str = "disruptionbudgets";
    const SHORT: &'static str = "budget";
    const REPLICATED: bool = true;
    const COLUMNS: &'static [Column] = &[
        Column::NAME,
        Column::of("SELECTOR", Cell::Text { path: "/spec/selector" }),
        Column::of("MIN-AVAILABLE", Cell::TextOr { path: "/spec/minAvailable", otherwise: "-" }),
        Column::of("MAX-UNAVAILABLE", Cell::TextOr { path: "/spec/maxUnavailable", otherwise: "-" }),
        Column::of("HEALTHY", Cell::Ratio { a: "/status/currentHealthy", b: "/status/expectedMembers" }),
        Column::of("ALLOWED", Cell::Count { path: "/status/disruptionsAllowed" }),
        Column::AGE,
        Column::wide("DESIRED", Cell::Count { path: "/status/desiredHealthy" }),
        Column::wide("UNHEALTHY", Cell::Each { path: "/status/unhealthy", field: "/name" }),
    ];
    const HAS_STATUS: bool = true;
    type Status = DisruptionBudgetStatus;

    fn validate_spec(&self, path: &FieldPath, errors: &mut ValidationErrors) {
        match LabelSelector::parse(&self.selector) {
            Err(error) => errors.add(&path.child("selector"), error.reason),
            Ok(selector) if selector.is_empty() => errors.add(
                &path.child("selector"),
                "must not be empty: a budget over every member would hold every drain hostage",
            ),
            Ok(_) => {}
        }
        match (self.min_available, self.max_unavailable) {
            (None, None) => {
                errors.add(&path.child("minAvailable"), "one of minAvailable and maxUnavailable is required")
            }
            (Some(_), Some(_)) => errors.add(
                &path.child("maxUnavailable"),
                "give either minAvailable or maxUnavailable, not both (they say the same thing two ways)",
            ),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> Result<DisruptionBudgetSpec, String> {
        serde_json::from_value(json).map_err(|e| e.to_string())
    }

    fn errors(spec: &DisruptionBudgetSpec) -> String {
        let mut errors = ValidationErrors::default();
        spec.validate_spec(&FieldPath::root("spec"), &mut errors);
        errors.to_string()
    }

    #[test]
    fn amounts_are_counts_or_percentages() {
        let read = |v: serde_json::Value| spec(serde_json::json!({"selector": "a=b", "minAvailable": v}));
        assert_eq!(read(serde_json::json!(2)).unwrap().min_available, Some(Amount::Count(2)));
        assert_eq!(read(serde_json::json!("34%")).unwrap().min_available, Some(Amount::Percent(34)));
        assert_eq!(read(serde_json::json!("100%")).unwrap().min_available, Some(Amount::Percent(100)));
        assert_eq!(read(serde_json::json!("0%")).unwrap().min_available, Some(Amount::Percent(0)));
        for bad in ["101%", "34", "%", "-1%", "034%", "3.5%", " 34%"] {
            let error = read(serde_json::json!(bad)).unwrap_err();
            assert!(error.contains("is not a percentage"), "{bad}: {error}");
        }
        assert!(read(serde_json::json!(-1)).unwrap_err().contains("is negative"));
        assert!(read(serde_json::json!(1.5)).is_err());
        let json = serde_json::to_value(read(serde_json::json!("34%")).unwrap()).unwrap();
        assert_eq!(json["minAvailable"], "34%");
    }

    #[test]
    fn percentages_round_up() {
        assert_eq!(Amount::Percent(34).of(3), 2, "34% of 3 is 1.02: 2");
        assert_eq!(Amount::Percent(50).of(3), 2, "50% of 3 is 1.5: 2");
        assert_eq!(Amount::Percent(33).of(3), 1, "33% of 3 is 0.99: 1");
        assert_eq!(Amount::Percent(100).of(3), 3);
        assert_eq!(Amount::Percent(0).of(3), 0);
        assert_eq!(Amount::Percent(1).of(0), 0, "nothing expected: 0");
        assert_eq!(Amount::Percent(20).of(5), 1, "exact: 1");
        assert_eq!(Amount::Count(7).of(3), 7, "a count is a count");
    }

    #[test]
    fn exactly_one_bound_and_a_selector_are_required() {
        let ok = spec(serde_json::json!({"selector": "herd.io/cluster=etcd", "maxUnavailable": 1})).unwrap();
        assert_eq!(errors(&ok), "");
        let neither = spec(serde_json::json!({"selector": "a=b"})).unwrap();
        assert!(errors(&neither).contains("spec.minAvailable: one of minAvailable and maxUnavailable is required"));
        let both = spec(serde_json::json!({"selector": "a=b", "minAvailable": 1, "maxUnavailable": 1})).unwrap();
        assert!(errors(&both).contains("spec.maxUnavailable: give either"));
        let empty = spec(serde_json::json!({"selector": " ", "minAvailable": 1})).unwrap();
        assert!(errors(&empty).contains("spec.selector: must not be empty"));
        let broken = spec(serde_json::json!({"selector": "a in (b", "minAvailable": 1})).unwrap();
        assert!(errors(&broken).starts_with("spec.selector: "), "{}", errors(&broken));
    }
}
