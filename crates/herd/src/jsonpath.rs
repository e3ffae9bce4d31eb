//! `-o jsonpath=TEMPLATE`, the part of kubectl's JSONPath templates that
//! scripts use: text with `{...}` expressions; a path (`.a.b`, `.a[0]`,
//! `.a[-1]`, `.a[*]`, `.a['dotted.key']`, `$` for the whole object, `.`
//! for the current one), a string (`{"\n"}`), and `{range PATH}...{end}`
//! over what a path finds. Several values found by one path are joined by
//! spaces; strings print bare, everything else as compact JSON; a path
//! that finds nothing prints nothing (kubectl's `allowMissingKeys`).

use serde_json::Value;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Step {
    Field(String),
    Index(i64),
    All,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Path {
    /// From the whole object (`$`) rather than the current one.
    from_root: bool,
    steps: Vec<Step>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Piece {
    Text(String),
    Path(Path),
    Range(Path, Vec<Piece>),
}

/// A parsed template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Template {
    source: String,
    pieces: Vec<Piece>,
}

impl std::fmt::Display for Template {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.source)
    }
}

fn string_literal(body: &str) -> Result<String, String> {
    let inner = body
        .strip_prefix('"')
        .and_then(|rest| rest.strip_suffix('"'))
        .ok_or_else(|| format!("{{{body}}}: a string must be in double quotes"))?;
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('t') => out.push('\t'),
            Some('r') => out.push('\r'),
            Some(other @ ('\\' | '"')) => out.push(other),
            other => return Err(format!("{{{body}}}: unknown escape \\{}", other.unwrap_or(' '))),
        }
    }
    Ok(out)
}

fn parse_path(expression: &str) -> Result<Path, String> {
    let bad = |why: &str| format!("{{{expression}}}: {why}");
    let (from_root, mut rest) = match expression.strip_prefix('$') {
        Some(rest) => (true, rest),
        None if expression.starts_with('.') => (false, expression),
        None => return Err(bad("a path starts with . (the current object) or $ (the whole object)")),
    };
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').ok_or_else(|| bad("[ without ]"))?;
            let inside = after[..end].trim();
            steps.push(if inside == "*" {
                Step::All
            } else if let Some(key) = inside
                .strip_prefix('\'')
                .and_then(|k| k.strip_suffix('\''))
                .or_else(|| inside.strip_prefix('"').and_then(|k| k.strip_suffix('"')))
            {
                Step::Field(key.to_string())
            } else {
                Step::Index(inside.parse().map_err(|_| bad(&format!("[{inside}] is not an index, * or a quoted key")))?)
            });
            rest = &after[end + 1..];
        } else if let Some(after) = rest.strip_prefix('.') {
            // A field name runs to the next unescaped . or [.
            let mut name = String::new();
            let mut chars = after.char_indices().peekable();
            let mut consumed = after.len();
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' if chars.peek().is_some_and(|(_, n)| *n == '.') => {
                        name.push('.');
                        chars.next();
                    }
                    '.' | '[' => {
                        consumed = i;
                        break;
                    }
                    _ => name.push(c),
                }
            }
            if name == "*" {
                steps.push(Step::All);
            } else if !name.is_empty() {
                steps.push(Step::Field(name));
            } else if consumed != after.len() || !steps.is_empty() {
                return Err(bad("an empty field name"));
            }
            rest = &after[consumed..];
        } else {
            return Err(bad(&format!("unexpected {rest:?}")));
        }
    }
    Ok(Path { from_root, steps })
}

impl std::str::FromStr for Template {
    type Err = String;

    fn from_str(source: &str) -> Result<Template, String> {
        // Open ranges: the pieces gathered so far outside, and the path.
        let mut stack: Vec<(Vec<Piece>, Path)> = Vec::new();
        let mut pieces = Vec::new();
        let mut rest = source;
        while !rest.is_empty() {
            let Some(open) = rest.find('{') else {
                pieces.push(Piece::Text(rest.to_string()));
                break;
            };
            if open > 0 {
                pieces.push(Piece::Text(rest[..open].to_string()));
            }
            let after = &rest[open + 1..];
            let close = after.find('}').ok_or_else(|| format!("{{ without }} in {source:?}"))?;
            let body = after[..close].trim();
            rest = &after[close + 1..];
            if body.starts_with('"') {
                pieces.push(Piece::Text(string_literal(body)?));
            } else if let Some(path) = body.strip_prefix("range ") {
                stack.push((std::mem::take(&mut pieces), parse_path(path.trim())?));
            } else if body == "end" {
                let (outside, path) = stack.pop().ok_or("{end} without {range ...}")?;
                let inside = std::mem::replace(&mut pieces, outside);
                pieces.push(Piece::Range(path, inside));
            } else {
                pieces.push(Piece::Path(parse_path(body)?));
            }
        }
        if !stack.is_empty() {
            return Err("{range ...} without {end}".into());
        }
        Ok(Template { source: source.to_string(), pieces })
    }
}

fn find<'v>(path: &Path, root: &'v Value, current: &'v Value) -> Vec<&'v Value> {
    let mut found = vec![if path.from_root { root } else { current }];
    for step in &path.steps {
        found = found
            .into_iter()
            .flat_map(|value| -> Vec<&Value> {
                match (step, value) {
                    (Step::Field(name), Value::Object(map)) => map.get(name).into_iter().collect(),
                    (Step::Index(i), Value::Array(items)) => {
                        let index = if *i < 0 { items.len() as i64 + i } else { *i };
                        usize::try_from(index).ok().and_then(|i| items.get(i)).into_iter().collect()
                    }
                    (Step::All, Value::Array(items)) => items.iter().collect(),
                    (Step::All, Value::Object(map)) => map.values().collect(),
                    _ => Vec::new(),
                }
            })
            .collect();
    }
    found
}

fn show(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}

fn render_pieces(pieces: &[Piece], root: &Value, current: &Value, out: &mut String) {
    for piece in pieces {
        match piece {
            Piece::Text(text) => out.push_str(text),
            Piece::Path(path) => {
                let shown: Vec<String> = find(path, root, current).into_iter().map(show).collect();
                out.push_str(&shown.join(" "));
            }
            Piece::Range(path, inside) => {
                for item in find(path, root, current) {
                    render_pieces(inside, root, item, out);
                }
            }
        }
    }
}

impl Template {
    pub fn render(&self, value: &Value) -> String {
        let mut out = String::new();
        render_pieces(&self.pieces, value, value, &mut out);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn render(template: &str, value: &Value) -> String {
        template.parse::<Template>().unwrap().render(value)
    }

    #[test]
    fn paths_strings_and_ranges_render_as_kubectl_does() {
        let list = json!({
            "kind": "NodeList",
            "items": [
                { "metadata": { "name": "n1", "labels": { "herd.io/zone": "a" } }, "status": { "ready": true } },
                { "metadata": { "name": "n2" }, "status": { "ready": false } }
            ]
        });
        assert_eq!(render("{.kind}", &list), "NodeList");
        assert_eq!(render("{.items[*].metadata.name}", &list), "n1 n2");
        assert_eq!(render("{.items[0].status.ready}", &list), "true");
        assert_eq!(render("{.items[-1].metadata.name}", &list), "n2");
        assert_eq!(render("{.items[0].metadata.labels['herd.io/zone']}", &list), "a");
        assert_eq!(render(r"{.items[0].metadata.labels.herd\.io/zone}", &list), "a");
        assert_eq!(
            render(r#"{range .items[*]}{.metadata.name}={.status.ready}{"\n"}{end}"#, &list),
            "n1=true\nn2=false\n"
        );
        assert_eq!(render("{range .items[*]}{$.kind} {end}", &list), "NodeList NodeList ");
        assert_eq!(render("name: {.items[1].metadata}", &list), r#"name: {"name":"n2"}"#);
        assert_eq!(render("{.missing.field}", &list), "", "nothing found prints nothing");
    }

    #[test]
    fn bad_templates_say_what_is_wrong() {
        for (bad, says) in [
            ("{.a", "without }"),
            ("{range .items[*]}{.a}", "without {end}"),
            ("{end}", "without {range"),
            ("{a.b}", "a path starts with"),
            ("{.a[x]}", "is not an index"),
            ("{.a[0}", "[ without ]"),
            (r#"{"\q"}"#, "unknown escape"),
        ] {
            let error = bad.parse::<Template>().unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
        }
    }
}
