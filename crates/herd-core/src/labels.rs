//! Labels on objects and label selectors over them (Kubernetes syntax).
//!
//! A selector is a comma-separated list of requirements, all of which must
//! hold: `app=web`, `app==web`, `tier!=db`, `env in (prod,staging)`,
//! `env notin (dev)`, `critical` (key present), `!legacy` (key absent).
//! Values are label values (empty, or as a key's name part); spaces around
//! the parts are allowed. [`SELECTOR_PATTERN`] is the same grammar as a
//! regular expression, for the API's schema.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::validation::{FieldPath, ValidationErrors};

pub type Labels = BTreeMap<String, String>;

/// A label selector as [`LabelSelector::parse`] takes it (but for the 253
/// characters a key's prefix may have), as an ECMA/Python regex.
pub const SELECTOR_PATTERN: &str = concat!(
    "^(?: *|",
    " *(?:!",
    " *(?:(?:[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)",
    "|(?:(?:[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)",
    "(?: *(?:==|=|!=) *(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?",
    "| +(?:in|notin) +\\( *[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?(?: *, *[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)* *\\)",
    ")?) *",
    "(?:, *(?:!",
    " *(?:(?:[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)",
    "|(?:(?:[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?(?:\\.[A-Za-z0-9](?:[-A-Za-z0-9_]{0,61}[A-Za-z0-9])?)*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)",
    "(?: *(?:==|=|!=) *(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?",
    "| +(?:in|notin) +\\( *[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?(?: *, *[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)* *\\)",
    ")?) *)*",
    ")$"
);

fn is_label_part(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= 63
        && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        && text.starts_with(|c: char| c.is_ascii_alphanumeric())
        && text.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// Checks a label (or annotation) key: an optional DNS prefix and `/`, then a
/// name of at most 63 letters, digits, `-`, `_` and `.`.
pub fn check_key(path: &FieldPath, key: &str, errors: &mut ValidationErrors) {
    let name = match key.split_once('/') {
        Some((prefix, name)) => {
            if prefix.is_empty() || prefix.len() > 253 || !prefix.split('.').all(is_label_part) {
                errors.add(path, format!("key {key:?} has an invalid prefix (a DNS subdomain is expected before '/')"));
            }
            name
        }
        None => key,
    };
    if !is_label_part(name) {
        errors.add(
            path,
            format!("key {key:?}: name must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"),
        );
    }
}

/// Checks every key and value of a label map.
pub fn check_labels(path: &FieldPath, labels: &Labels, errors: &mut ValidationErrors) {
    for (key, value) in labels {
        check_key(path, key, errors);
        if !value.is_empty() && !is_label_part(value) {
            errors.add(
                &path.key(key),
                format!("value {value:?} must be empty or 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"),
            );
        }
    }
}

/// The most bytes all annotations of one object may take, keys and values
/// together (Kubernetes' limit): annotations are notes, not storage.
pub const MAX_ANNOTATIONS_BYTES: usize = 256 * 1024;

/// Checks annotation keys and their total size; values are free text.
pub fn check_annotations(path: &FieldPath, annotations: &Labels, errors: &mut ValidationErrors) {
    for key in annotations.keys() {
        check_key(path, key, errors);
    }
    let total: usize = annotations.iter().map(|(key, value)| key.len() + value.len()).sum();
    if total > MAX_ANNOTATIONS_BYTES {
        errors.add(
            path,
            format!("may take at most {MAX_ANNOTATIONS_BYTES} bytes in all (keys and values), take {total}"),
        );
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, BTreeSet<String>),
    NotIn(String, BTreeSet<String>),
    Exists(String),
    NotExists(String),
}

impl Requirement {
    fn matches(&self, labels: &Labels) -> bool {
        match self {
            Requirement::Equals(k, v) => labels.get(k) == Some(v),
            Requirement::NotEquals(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        }
    }
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid label selector {selector:?}: {reason}")]
pub struct SelectorError {
    pub selector: String,
    pub reason: String,
}

impl LabelSelector {
    pub fn parse(text: &str) -> Result<Self, SelectorError> {
        let fail = |reason: String| SelectorError { selector: text.to_string(), reason };
        let mut requirements = Vec::new();
        if text.trim_matches(' ').is_empty() {
            return Ok(LabelSelector { requirements });
        }
        for clause in split_top_level(text).map_err(fail)? {
            let clause = clause.trim_matches(' ');
            if clause.is_empty() {
                return Err(fail("empty requirement (two commas, or a trailing comma?)".into()));
            }
            requirements.push(parse_requirement(clause).map_err(fail)?);
        }
        Ok(LabelSelector { requirements })
    }

    /// A selector requiring exactly these key=value pairs.
    pub fn from_labels(labels: &Labels) -> Self {
        LabelSelector { requirements: labels.iter().map(|(k, v)| Requirement::Equals(k.clone(), v.clone())).collect() }
    }

    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The pre-test of serialised objects against this selector, made once
    /// for the many objects a watch sees.
    pub fn json_prefilter(&self) -> JsonPrefilter {
        let needles = self
            .requirements
            .iter()
            .filter_map(|r| match r {
                Requirement::Equals(_, value) => {
                    Some(memchr::memmem::Finder::new(format!("\"{value}\"").as_bytes()).into_owned())
                }
                _ => None,
            })
            .collect();
        JsonPrefilter { needles }
    }
}

/// Whether an object serialised as JSON may match a selector: false only
/// when the value of one of its equality requirements appears nowhere in
/// it as a JSON string (label values need no escaping, so a matching
/// object always holds `"value"`). A scan, made before the labels are
/// parsed out of the JSON: a watch of one node's Commands turns away the
/// other nodes' thousands this way.
pub struct JsonPrefilter {
    needles: Vec<memchr::memmem::Finder<'static>>,
}

impl JsonPrefilter {
    pub fn may_match(&self, json: &[u8]) -> bool {
        self.needles.iter().all(|needle| needle.find(json).is_some())
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
        for (i, r) in self.requirements.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            match r {
                Requirement::Equals(k, v) => write!(f, "{k}={v}")?,
                Requirement::NotEquals(k, v) => write!(f, "{k}!={v}")?,
                Requirement::In(k, vs) => write!(f, "{k} in ({})", set(vs))?,
                Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", set(vs))?,
                Requirement::Exists(k) => write!(f, "{k}")?,
                Requirement::NotExists(k) => write!(f, "!{k}")?,
            }
        }
        Ok(())
    }
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(text: &str) -> Result<Vec<&str>, String> {
    let mut parts = Vec::new();
    let mut depth = 0usize;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.checked_sub(1).ok_or("unbalanced ')'")?,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err("unbalanced '('".into());
    }
    parts.push(&text[start..]);
    Ok(parts)
}

fn checked_key(key: &str) -> Result<String, String> {
    let key = key.trim_matches(' ');
    let mut errors = ValidationErrors::new();
    check_key(&FieldPath::root("labelSelector"), key, &mut errors);
    if errors.is_empty() { Ok(key.to_string()) } else { Err(errors.errors[0].reason.clone()) }
}

fn checked_value(value: &str, may_be_empty: bool) -> Result<String, String> {
    let value = value.trim_matches(' ');
    if (value.is_empty() && may_be_empty) || is_label_part(value) {
        Ok(value.to_string())
    } else {
        Err(format!(
            "value {value:?} must be 1-63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
        ))
    }
}

fn parse_set(key: &str, rest: &str) -> Result<(String, BTreeSet<String>), String> {
    let rest = rest.trim_matches(' ');
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| format!("values for {key:?} must be in parentheses, like (a,b)"))?;
    let values = inner.split(',').map(|v| checked_value(v, false)).collect::<Result<BTreeSet<String>, _>>()?;
    Ok((checked_key(key)?, values))
}

fn parse_requirement(clause: &str) -> Result<Requirement, String> {
    if let Some((key, value)) = clause.split_once("!=") {
        return Ok(Requirement::NotEquals(checked_key(key)?, checked_value(value, true)?));
    }
    if let Some((key, value)) = clause.split_once("==").or_else(|| clause.split_once('=')) {
        return Ok(Requirement::Equals(checked_key(key)?, checked_value(value, true)?));
    }
    if let Some((key, rest)) = clause.split_once(" notin ") {
        let (key, values) = parse_set(key, rest)?;
        return Ok(Requirement::NotIn(key, values));
    }
    if let Some((key, rest)) = clause.split_once(" in ") {
        let (key, values) = parse_set(key, rest)?;
        return Ok(Requirement::In(key, values));
    }
    if let Some(key) = clause.strip_prefix('!') {
        return Ok(Requirement::NotExists(checked_key(key)?));
    }
    Ok(Requirement::Exists(checked_key(clause)?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn may_match_json_turns_away_objects_without_the_value() {
        let selector = LabelSelector::parse("herd.io/node=node-7").unwrap();
        let prefilter = selector.json_prefilter();
        assert!(!prefilter.may_match(br#"{"metadata":{"labels":{"herd.io/node":"node-17"}}}"#));
        assert!(prefilter.may_match(br#"{"metadata":{"labels":{"herd.io/node":"node-7"}}}"#));
    }

    #[test]
    fn selector_forms() {
        let l = labels(&[("app", "web"), ("env", "prod")]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web", true),
            ("app!=web", false),
            ("app=web,env=dev", false),
            ("env in (prod, staging)", true),
            ("env notin (prod)", false),
            ("tier notin (db)", true),
            ("app", true),
            ("!app", false),
            ("!tier", true),
            ("app=web,env in (prod),!tier", true),
        ] {
            assert_eq!(LabelSelector::parse(sel).unwrap().matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn selector_errors_say_why() {
        for (sel, reason) in [
            ("app=web,", "empty requirement"),
            ("env in (a", "unbalanced '('"),
            ("env in a,b", "parentheses"),
            ("bad key=1", "name must be"),
        ] {
            let err = LabelSelector::parse(sel).unwrap_err();
            assert!(err.reason.contains(reason), "{sel}: {err}");
        }
    }

    #[test]
    fn label_values_are_checked() {
        let mut errors = ValidationErrors::new();
        check_labels(
            &FieldPath::root("metadata").child("labels"),
            &labels(&[("ok", ""), ("app", "no spaces")]),
            &mut errors,
        );
        assert_eq!(errors.errors.len(), 1);
        assert_eq!(errors.errors[0].field, "metadata.labels[app]");
    }

    #[test]
    fn annotations_take_at_most_256_kib_in_all() {
        let path = FieldPath::root("metadata").child("annotations");
        let half = "x".repeat(MAX_ANNOTATIONS_BYTES / 2);
        let mut errors = ValidationErrors::new();
        check_annotations(&path, &labels(&[("a", &half[1..]), ("b", &half[1..])]), &mut errors);
        assert!(errors.is_empty(), "{errors}");
        check_annotations(&path, &labels(&[("a", &half), ("b", &half)]), &mut errors);
        assert_eq!(errors.errors.len(), 1, "{errors}");
        assert_eq!(errors.errors[0].field, "metadata.annotations");
        assert!(errors.errors[0].reason.contains("262146"), "{errors}");
    }

    proptest! {
        /// A selector built from an object's own labels always matches it,
        /// and survives printing and parsing again.
        #[test]
        fn own_labels_match(map in proptest::collection::btree_map("[a-z][a-z0-9]{0,8}", "[a-z0-9]{1,8}", 0..6)) {
            let selector = LabelSelector::from_labels(&map);
            prop_assert!(selector.matches(&map));
            let reparsed = LabelSelector::parse(&selector.to_string()).unwrap();
            prop_assert_eq!(reparsed, selector);
        }

        /// The JSON pre-test never turns away an object that matches.
        #[test]
        fn may_match_json_keeps_every_match(
            map in proptest::collection::btree_map("[a-z][a-z0-9]{0,3}", "[a-z0-9]{1,3}", 0..4),
            wanted in proptest::collection::btree_map("[a-z][a-z0-9]{0,3}", "[a-z0-9]{1,3}", 1..3),
        ) {
            let selector = LabelSelector::from_labels(&wanted);
            let json = serde_json::to_vec(&serde_json::json!({"metadata": {"labels": map}})).unwrap();
            if selector.matches(&map) {
                prop_assert!(selector.json_prefilter().may_match(&json));
            }
            let own = LabelSelector::from_labels(&map);
            prop_assert!(own.json_prefilter().may_match(&json));
        }

        /// The schema's pattern takes exactly what the parser takes.
        #[test]
        fn the_pattern_is_the_grammar(parts in proptest::collection::vec(
            proptest::sample::select(vec![
                "a", "Zz", "0", "-", "_", ".", "/", "=", "==", "!", "!=", " ", ",", "(", ")", " in ", " notin ", "in", "x.y/",
            ]),
            0..12,
        )) {
            let text: String = parts.concat();
            let pattern = regex::Regex::new(SELECTOR_PATTERN).unwrap();
            prop_assert_eq!(pattern.is_match(&text), LabelSelector::parse(&text).is_ok(), "{:?}", text);
        }
    }

    #[test]
    fn the_pattern_takes_the_documented_forms() {
        let pattern = regex::Regex::new(SELECTOR_PATTERN).unwrap();
        for ok in ["", "  ", "app=web", "app == web", "tier!=", "env in (prod, staging)", "a notin (b),!c", "x.y/z"] {
            assert!(pattern.is_match(ok) && LabelSelector::parse(ok).is_ok(), "{ok:?}");
        }
        for bad in ["app=web,", "a=b c", "a\n", "env in a", "!a=b", "a=(b)"] {
            assert!(!pattern.is_match(bad) && LabelSelector::parse(bad).is_err(), "{bad:?}");
        }
    }
}
