//! Where in a manifest a field is: the line of a field path
//! (`spec.roles[0].readiness.timeout`) in the YAML (or JSON) text it was
//! read from, so that `herd apply` can say "line 14" beside the field a
//! refusal names. Best effort, by indentation: a key is looked for
//! under the line of its parent, a list item as the parent's n-th `- `;
//! flow style (`{name: web}`) and a field that is absent (a missing
//! required one) give the line of the nearest part of the path found.

/// The documents of a multi-document YAML text: each one's text and the
/// 1-based line it starts on (a `---` line separates them).
pub fn documents(text: &str) -> Vec<(String, usize)> {
    // Only comments, or nothing: no document.
    let has_content = |text: &str| text.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'));
    let mut documents = Vec::new();
    let mut current = String::new();
    let mut start = 1;
    for (index, line) in text.lines().enumerate() {
        if line.trim_end() == "---" || line.starts_with("--- ") {
            if has_content(&current) {
                documents.push((std::mem::take(&mut current), start));
            }
            current.clear();
            start = index + 2;
            continue;
        }
        current.push_str(line);
        current.push('\n');
    }
    if has_content(&current) {
        documents.push((current, start));
    }
    documents
}

/// A path's parts: keys and list indexes.
enum Part<'a> {
    Key(&'a str),
    Index(usize),
}

fn parts(path: &str) -> Vec<Part<'_>> {
    let mut parts = Vec::new();
    for piece in path.split('.') {
        let (key, indexes) = piece.split_once('[').map_or((piece, ""), |(k, rest)| (k, rest));
        if !key.is_empty() {
            parts.push(Part::Key(key));
        }
        for index in indexes.split('[').map(|i| i.trim_end_matches(']')).filter(|i| !i.is_empty()) {
            match index.parse() {
                Ok(n) => parts.push(Part::Index(n)),
                Err(_) => parts.push(Part::Key(index)),
            }
        }
    }
    parts
}

fn indent(line: &str) -> usize {
    line.len() - line.trim_start().len()
}

/// The key a line starts with (after any `- `), unquoted.
fn key_of(line: &str) -> Option<&str> {
    let content = line.trim_start().trim_start_matches("- ").trim_start();
    let (key, _) = content.split_once(':')?;
    Some(key.trim().trim_matches('"').trim_matches('\''))
}

/// The 1-based line (within `text`) of the field `path`, or of the
/// nearest part of it found.
pub fn line_of(text: &str, path: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().collect();
    let content = |i: usize| !lines[i].trim().is_empty() && !lines[i].trim_start().starts_with('#');
    let item = |i: usize| lines[i].trim_start().starts_with("- ");
    // The lines the next part is looked for in.
    let (mut from, mut to) = (0, lines.len());
    let mut found = None;
    for part in parts(path) {
        let hit = match part {
            Part::Key(key) => (from..to).find(|&i| content(i) && key_of(lines[i]) == Some(key)),
            Part::Index(n) => {
                let items: Vec<usize> = (from..to).filter(|&i| content(i) && item(i)).collect();
                let level = items.first().map(|&i| indent(lines[i]));
                items.into_iter().filter(|&i| Some(indent(lines[i])) == level).nth(n)
            }
        };
        let Some(line) = hit else { break };
        found = Some(line + 1);
        let level = indent(lines[line]);
        match part {
            Part::Key(_) => {
                // Its value on its line (a scalar, flow style): nothing below.
                if lines[line].split_once(':').is_some_and(|(_, value)| !value.trim().is_empty()) {
                    break;
                }
                // Its children: the deeper lines after it (a list may sit at
                // its own indentation).
                from = line + 1;
                to = (from..lines.len())
                    .find(|&i| content(i) && (indent(lines[i]) < level || (indent(lines[i]) == level && !item(i))))
                    .unwrap_or(lines.len());
            }
            // The item: its own line (after its dash) and the deeper ones.
            Part::Index(_) => {
                from = line;
                to = (line + 1..lines.len()).find(|&i| content(i) && indent(lines[i]) <= level).unwrap_or(lines.len());
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    const APP: &str = "apiVersion: herd/v1
kind: App
metadata:
  name: web
spec:
  roles:
    - name: db
      run:
        command: [sleep, '600']
    - name: cache
      run: {command: [sleep, '600']}
      readiness:
        command: [true]
        timeout: 5s
";

    #[test]
    fn a_field_is_found_on_its_line() {
        assert_eq!(line_of(APP, "metadata.name"), Some(4));
        assert_eq!(line_of(APP, "spec.roles[0].run.command"), Some(9));
        assert_eq!(line_of(APP, "spec.roles[1].readiness.timeout"), Some(14));
        assert_eq!(line_of(APP, "spec.roles[1].run.command"), Some(11), "flow style: its line");
        assert_eq!(line_of(APP, "spec.roles[1].placement"), Some(10), "absent: the nearest part found");
        assert_eq!(line_of(APP, "spec.roles[0].readiness"), Some(7), "not the other role's");
    }

    #[test]
    fn documents_are_split_with_the_line_each_starts_on() {
        let text = "kind: App\nmetadata: {name: a}\n---\nkind: AppCluster\nspec:\n  appRef: a\n";
        let documents = documents(text);
        assert_eq!(documents.len(), 2);
        assert_eq!(documents[1].1, 4);
        assert_eq!(line_of(&documents[1].0, "spec.appRef"), Some(3));
    }
}
