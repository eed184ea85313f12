//! Keeps ARCHITECTURE.md true, the way rust-analyzer's tidy tests do: the
//! code map's "must not depend on" column is checked against every
//! `crate::` path each module names, and every module of `src/` must be on
//! the map.
//!
//! The column reads `anything` (the module names nothing of the crate),
//! `anything but a, b` (only those), a list of module paths (`bus::leader`,
//! `telegram`), or `—` (no rule).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// One row of the code map.
struct Row {
    paths: Vec<String>,
    rule: Rule,
}

#[derive(Debug)]
enum Rule {
    None,
    Nothing,
    Only(Vec<String>),
    Not(Vec<String>),
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The backticked words of a table cell.
fn ticked(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_string)
        .collect()
}

fn code_map() -> Vec<Row> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text
        .split("## Code map")
        .nth(1)
        .expect("a code map section")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [paths, _, rule] = cells[..] else {
            continue;
        };
        let paths: Vec<String> = ticked(paths)
            .into_iter()
            .filter(|p| p.starts_with("src/"))
            .collect();
        if paths.is_empty() {
            continue;
        }
        let rule = if rule == "—" || rule.is_empty() {
            Rule::None
        } else if rule == "anything" {
            Rule::Nothing
        } else if rule.starts_with("anything but") {
            Rule::Only(ticked(rule))
        } else {
            Rule::Not(ticked(rule))
        };
        rows.push(Row { paths, rule });
    }
    rows
}

/// `src/bus/leader/` → `bus::leader`; `src/config.rs` → `config`.
fn module_of(path: &str) -> String {
    path.trim_start_matches("src/")
        .trim_end_matches('/')
        .trim_end_matches(".rs")
        .replace('/', "::")
}

fn rust_files(path: &Path) -> Vec<PathBuf> {
    assert!(
        path.exists(),
        "ARCHITECTURE.md's code map names {}, which does not exist",
        path.display()
    );
    if path.is_file() {
        return vec![path.to_path_buf()];
    }
    let mut files = Vec::new();
    let mut dirs = vec![path.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let p = entry.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                files.push(p);
            }
        }
    }
    files
}

/// Unit tests may use whatever they test with.
fn is_test_file(file: &Path) -> bool {
    file.file_name().is_some_and(|n| n == "tests.rs")
        || file.components().any(|c| c.as_os_str() == "tests")
}

/// The source up to its inline test module (`#[cfg(test)] mod tests {`).
fn without_tests(source: &str) -> String {
    let mut kept = Vec::new();
    let mut lines = source.lines().peekable();
    while let Some(line) = lines.next() {
        if line.trim() == "#[cfg(test)]"
            && lines
                .peek()
                .is_some_and(|next| next.trim_start().starts_with("mod tests {"))
        {
            break;
        }
        kept.push(line);
    }
    kept.join("\n")
}

/// Every `crate::…` path the source names, `use` groups expanded.
fn crate_paths(source: &str) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut rest = code.as_str();
    while let Some(at) = rest.find("crate::") {
        let preceded = rest[..at]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$');
        rest = &rest[at + "crate::".len()..];
        if preceded {
            continue; // `$crate::`, `other_crate::`
        }
        expand("", rest, &mut found);
    }
    found
}

/// Expands the path at the start of `text` (after `crate::`), recursing
/// into `{…}` groups, and records each full path.
fn expand(prefix: &str, text: &str, found: &mut BTreeSet<String>) {
    if let Some(group) = text.strip_prefix('{') {
        let mut depth = 0;
        let mut start = 0;
        for (i, c) in group.char_indices() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => {
                    expand(prefix, group[start..i].trim(), found);
                    return;
                }
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(prefix, group[start..i].trim(), found);
                    start = i + 1;
                }
                _ => {}
            }
        }
        return;
    }
    let end = text
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let (path, after) = text.split_at(end);
    let path = path.trim_end_matches("::");
    let full = if prefix.is_empty() {
        path.to_string()
    } else if path.is_empty() || path == "self" {
        prefix.to_string()
    } else {
        format!("{prefix}::{path}")
    };
    if after.starts_with('{') {
        expand(&full, after, found);
    } else if !full.is_empty() && full != "self" {
        found.insert(full);
    }
}

fn within(path: &str, module: &str) -> bool {
    path == module || path.starts_with(&format!("{module}::"))
}

#[test]
fn modules_depend_only_on_what_the_code_map_allows() {
    let mut broken = Vec::new();
    for row in code_map() {
        for path in &row.paths {
            let own = module_of(path);
            for file in rust_files(&root().join(path)) {
                if is_test_file(&file) {
                    continue;
                }
                let source = without_tests(&std::fs::read_to_string(&file).expect("read source"));
                for used in crate_paths(&source) {
                    if within(&used, &own) {
                        continue;
                    }
                    let allowed = match &row.rule {
                        Rule::None => true,
                        Rule::Nothing => false,
                        Rule::Only(allowed) => allowed.iter().any(|m| within(&used, m)),
                        Rule::Not(banned) => !banned.iter().any(|m| within(&used, m)),
                    };
                    if !allowed {
                        let file = file.strip_prefix(root()).unwrap_or(&file).display();
                        broken.push(format!("{file} uses crate::{used} ({:?})", row.rule));
                    }
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "ARCHITECTURE.md's code map forbids these:\n{}",
        broken.join("\n")
    );
}

#[test]
fn every_module_is_on_the_code_map() {
    let mapped: BTreeSet<String> = code_map()
        .into_iter()
        .flat_map(|r| r.paths)
        .map(|p| module_of(&p))
        .collect();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(root().join("src"))
        .expect("src")
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        if matches!(name.as_str(), "lib.rs" | "main.rs" | "bin") {
            continue;
        }
        let module = name.trim_end_matches(".rs").to_string();
        if !mapped
            .iter()
            .any(|m| within(m, &module) || within(&module, m))
        {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "not on ARCHITECTURE.md's code map: {missing:?}"
    );
}

#[test]
fn the_path_parser_sees_groups_and_inline_paths() {
    let source = "use crate::{config::{BotId, Config}, ids::Slot};\n\
                  use crate::store::Store;\n\
                  fn f() { crate::redact::redact(\"x\"); $crate::nope::x; }\n\
                  // crate::commented::out\n\
                  use crate::bus::{self, wire::Incoming};";
    let found: Vec<String> = crate_paths(source).into_iter().collect();
    assert_eq!(
        found,
        [
            "bus",
            "bus::wire::Incoming",
            "config::BotId",
            "config::Config",
            "ids::Slot",
            "redact::redact",
            "store::Store"
        ]
    );
}

/// The design the code cites is the repository's own: a reference names a
/// file that exists (`docs/DESIGN.md`), never a section number of a plan
/// that is not in the clone.
#[test]
fn design_references_point_into_the_repository() {
    let mut stale = Vec::new();
    for file in rust_files(&root().join("src")) {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if line.contains("DESIGN §") {
                stale.push(format!("{}:{}: {}", file.display(), n + 1, line.trim()));
            }
        }
        // In comments only: tests and fixtures may name made-up files.
        let comments = text
            .lines()
            .filter(|l| l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for cited in comments
            .match_indices("docs/")
            .map(|(at, _)| &comments[at..])
        {
            let path: String = cited
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "/._-".contains(*c))
                .collect();
            let path = path.trim_end_matches('.');
            if path.ends_with(".md") && !root().join(path).exists() {
                stale.push(format!(
                    "{}: cites {path}, which is not in the repository",
                    file.display()
                ));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "stale design references:\n{}",
        stale.join("\n")
    );
}
