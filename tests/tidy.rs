//! Keeps ARCHITECTURE.md and the other documents true, the way
//! rust-analyzer's tidy tests do.
//!
//! * **The code map.** Its "must not depend on" column is checked against
//!   every `crate::` path each module names, and every module of `src/`
//!   must be on the map. The column reads `anything` (the module names
//!   nothing of the crate), `anything but a, b` (only those), a list of
//!   module paths (`leader`, `telegram`), or `—` (no rule). The short file
//!   names a row gives (`conn.rs`, `asks/`) are the row's own files.
//! * **Cited paths.** Every path a Markdown file of the repository cites
//!   exists, and so does every path a comment in `src/` or a fuzz target
//!   cites. A path is cited when it starts with a folder of the repository
//!   (`src/`, `tests/`, `scripts/`, `schema/`, `docs/`, `fuzz/`,
//!   `claude-plugin/`), or, in backticks, is a module file named from a
//!   folder of modules (`session/dialog.rs`, read under `src/`; in a
//!   comment, under the commenting file's folder first). A `::name` suffix
//!   (`src/x.rs::a_test`) names an item the Rust file must define (`fn`,
//!   `struct`, `enum`, `trait`, `type`, `const`, `static`, `mod` or
//!   `impl`), and so does each bare backticked name listed right after it
//!   (`` `tests/x.rs::a`, `b` ``): RELIABILITY.md's proofs are test names,
//!   and a renamed test fails here. Not paths: a citation with `…`, `<`,
//!   `>`, `*`, `{` or `}` in it is a pattern (`src/…`,
//!   `tests/<file>.rs::<test>`, `src/framing.rs::*`), and one through a
//!   folder tools make (`target/`, `node_modules/`, `corpus/`) names no
//!   file of the repository. A bare file name (`outbox.rs`) outside the
//!   code map is left to the reader.
//! * **No import circles between the files of one module.** Per folder
//!   module, its files (a subfolder counts as one) and the `super::` and
//!   `crate::` paths between them form a graph that must have no circle.
//!   The folder's `mod.rs` (or the crate's root) is no node: it is every
//!   file's parent, and what it re-exports is not followed. A circle may be
//!   allowed by name ([`ALLOWED_CIRCLES`]) when the module's doc says why
//!   the two files are one pair.
//! * **Short functions.** No function of `src/` (test code aside) is over
//!   [`LONGEST_FUNCTION`] lines, but those [`LONG_FUNCTIONS`] names with
//!   the reason, until they are split.

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

/// `src/leader/cluster/` → `leader::cluster`; `src/config.rs` → `config`.
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
    let source = "use crate::{ids::{BotId, Slot}, config::Config};\n\
                  use crate::store::Store;\n\
                  fn f() { crate::redact::redact(\"x\"); $crate::nope::x; }\n\
                  // crate::commented::out\n\
                  use crate::bus::{self, wire::Received};";
    let found: Vec<String> = crate_paths(source).into_iter().collect();
    assert_eq!(
        found,
        [
            "bus",
            "bus::wire::Received",
            "config::Config",
            "ids::BotId",
            "ids::Slot",
            "redact::redact",
            "store::Store"
        ]
    );
}

/// The design the code cites is the repository's own: a reference names a
/// file that exists (`docs/DESIGN.md`), never a section number of a plan
/// that is not in the clone; and what a comment cites (`outbox.rs` citing
/// `cluster/calls.rs`, read from its own folder first) is there.
#[test]
fn design_references_point_into_the_repository() {
    let mut stale = Vec::new();
    let sources = [root().join("src"), root().join("fuzz/fuzz_targets")];
    for file in sources.iter().flat_map(|s| rust_files(s)) {
        let text = std::fs::read_to_string(&file).expect("read source");
        for (n, line) in text.lines().enumerate() {
            if line.contains("DESIGN §") {
                stale.push(format!("{}:{}: {}", shown(&file), n + 1, line.trim()));
            }
        }
        // In comments only: tests and fixtures may name made-up files.
        let comments = text
            .lines()
            .map(|l| {
                if l.trim_start().starts_with("//") {
                    l
                } else {
                    ""
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        let own = file.parent().map(shown).unwrap_or_default();
        stale.extend(stale_citations(
            &comments,
            &[own, "src".into()],
            &shown(&file),
        ));
    }
    assert!(
        stale.is_empty(),
        "stale design references:\n{}",
        stale.join("\n")
    );
}

/// The folders a document's citations start from.
const CITED_ROOTS: [&str; 7] = [
    "src/",
    "tests/",
    "scripts/",
    "schema/",
    "docs/",
    "fuzz/",
    "claude-plugin/",
];

/// Folders of what tools make (git ignores them): a path through one is
/// not the repository's.
const MADE_BY_TOOLS: [&str; 5] = ["target", "node_modules", "corpus", "artifacts", "coverage"];

/// Characters that make a citation a pattern rather than a path.
const PATTERN_MARKS: [char; 6] = ['…', '<', '>', '*', '{', '}'];

/// One path a document cites, and the item it names in that file, if any.
#[derive(Debug)]
struct Citation {
    line: usize,
    path: String,
    item: Option<String>,
}

fn is_identifier(word: &str) -> bool {
    word.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && word.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The path cited at the start of `rest`, if one starts there, and how
/// long its text is: `(path, item, len)`.
fn cited_at(
    before: Option<char>,
    rest: &str,
    bases: &[String],
) -> Option<(String, Option<String>, usize)> {
    let rooted = CITED_ROOTS.iter().any(|r| rest.starts_with(r))
        && !before.is_some_and(|c| c.is_alphanumeric() || "_./-~$".contains(c));
    let len = rest
        .find(|c: char| c.is_whitespace() || "`)]\"',;|".contains(c))
        .unwrap_or(rest.len());
    let token = rest[..len].trim_end_matches(['.', ':']);
    let token = token.split('#').next().unwrap_or_default();
    let (path, item) = match token.split_once("::") {
        Some((path, item)) => (path, is_identifier(item).then(|| item.to_string())),
        None => (token.split(':').next().unwrap_or_default(), None),
    };
    // A module file named from a folder of modules (`session/dialog.rs`),
    // in backticks.
    let in_backticks = before == Some('`') && rest[len..].starts_with('`');
    let module_base = match path.split_once('/') {
        Some((folder, _)) if in_backticks && path.ends_with(".rs") => bases
            .iter()
            .find(|base| root().join(base).join(folder).is_dir()),
        _ => None,
    };
    let made_by_tools = path.split('/').any(|part| MADE_BY_TOOLS.contains(&part));
    if token.contains(PATTERN_MARKS) || made_by_tools {
        return None;
    }
    let path = match module_base {
        _ if rooted => path.to_string(),
        Some(base) => format!("{base}/{path}"),
        None => return None,
    };
    Some((path, item, len))
}

/// Every path a text cites (see the module's doc), with its `::item`
/// suffix, and the bare backticked names listed right after it
/// (`` `tests/x.rs::a`, `b` `` cites `a` and `b` in `tests/x.rs`). A module
/// file is looked for in the folders of modules `bases` names, in order.
fn citations(text: &str, bases: &[String]) -> Vec<Citation> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        // The file whose item was the last thing cited, and where it ended.
        let mut listing: Option<(String, usize)> = None;
        let mut at = 0;
        while let Some(c) = line[at..].chars().next() {
            let rest = &line[at..];
            if let Some((file, end)) = &listing
                && *end == at
                && let Some(listed) = rest.strip_prefix(", `")
                && let Some(close) = listed.find('`')
                && is_identifier(&listed[..close])
            {
                let end = at + ", `".len() + close + 1;
                found.push(Citation {
                    line: n + 1,
                    path: file.clone(),
                    item: Some(listed[..close].to_string()),
                });
                listing = Some((file.clone(), end));
                at = end;
                continue;
            }
            let Some((path, item, len)) = cited_at(line[..at].chars().last(), rest, bases) else {
                at += c.len_utf8();
                continue;
            };
            at += len;
            if item.is_some() && line[at..].starts_with('`') {
                listing = Some((path.clone(), at + 1));
            }
            found.push(Citation {
                line: n + 1,
                path,
                item,
            });
        }
    }
    found
}

/// Whether a Rust source defines `name` as an item.
fn defines(source: &str, name: &str) -> bool {
    [
        "fn", "struct", "enum", "trait", "type", "const", "static", "mod", "impl",
    ]
    .iter()
    .any(|kind| {
        source
            .match_indices(&format!("{kind} {name}"))
            .any(|(at, found)| {
                let before = source[..at].chars().last();
                let after = source[at + found.len()..].chars().next();
                !before.is_some_and(|c| c.is_alphanumeric() || c == '_')
                    && !after.is_some_and(|c| c.is_alphanumeric() || c == '_')
            })
    })
}

/// The repository's Markdown files, outside what git ignores.
fn markdown_files() -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![root()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir").flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && !name.starts_with('.') && !MADE_BY_TOOLS.contains(&name.as_str()) {
                dirs.push(entry.path());
            } else if kind.is_file() && name.ends_with(".md") {
                files.push(entry.path());
            }
        }
    }
    files.sort();
    files
}

/// What `text` (shown as `shown`) cites that is not there: a path that
/// does not exist, or an item its Rust file does not define.
fn stale_citations(text: &str, bases: &[String], shown: &str) -> Vec<String> {
    let mut stale = Vec::new();
    for cited in citations(text, bases) {
        let file = root().join(&cited.path);
        let at = format!("{shown}:{}", cited.line);
        if !file.exists() {
            stale.push(format!("{at}: {} does not exist", cited.path));
            continue;
        }
        let Some(item) = &cited.item else { continue };
        if !cited.path.ends_with(".rs") {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read source");
        if !defines(&source, item) {
            stale.push(format!("{at}: {} has no `{item}`", cited.path));
        }
    }
    stale
}

fn shown(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap_or(path)
        .display()
        .to_string()
}

#[test]
fn every_path_a_document_cites_exists() {
    let mut stale = Vec::new();
    for doc in markdown_files() {
        let text = std::fs::read_to_string(&doc).expect("read document");
        stale.extend(stale_citations(&text, &["src".to_string()], &shown(&doc)));
    }
    assert!(
        stale.is_empty(),
        "documents cite what is not there:\n{}",
        stale.join("\n")
    );
}

/// A code-map row names its own files short (`conn.rs`, `asks/`): each is
/// in a folder the row is about (`src/leader/`), beside a file it is about
/// (`src/cli.rs` → `main.rs`), or at the repository's root (`schema/`).
#[test]
fn the_code_map_names_files_that_exist() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let mut missing = Vec::new();
    for line in text.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [paths, what, ..] = cells[..] else {
            continue;
        };
        let mut folders: Vec<PathBuf> = ticked(paths)
            .iter()
            .map(|p| match p.strip_suffix('/') {
                Some(folder) => root().join(folder),
                None => root()
                    .join(p)
                    .parent()
                    .map(Path::to_path_buf)
                    .unwrap_or_else(root),
            })
            .collect();
        folders.push(root());
        for short in ticked(what) {
            let name = short.trim_end_matches('/');
            let is_file = short.ends_with(".rs") || short.ends_with('/');
            if !is_file || name.contains(['/', ' ']) || short.contains(PATTERN_MARKS) {
                continue;
            }
            if !folders.iter().any(|f| f.join(name).exists()) {
                missing.push(format!("{short} (row {})", ticked(paths).join(", ")));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "ARCHITECTURE.md's code map names files that are not there:\n{}",
        missing.join("\n")
    );
}

/// The integration tests are one binary (`tests/suite.rs`, `autotests =
/// false`): a file beside it that it does not name would never run.
#[test]
fn every_test_file_is_a_module_of_the_suite() {
    let folder = root().join("tests");
    let suite = std::fs::read_to_string(folder.join("suite.rs")).expect("tests/suite.rs");
    let named: BTreeSet<&str> = suite
        .lines()
        .filter_map(|l| l.strip_prefix("mod ")?.strip_suffix(';'))
        .collect();
    let mut left_out = Vec::new();
    for entry in std::fs::read_dir(&folder).expect("tests/") {
        let path = entry.expect("tests/ entry").path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if let Some(module) = name.strip_suffix(".rs")
            && module != "suite"
            && !named.contains(module)
        {
            left_out.push(name.to_string());
        }
    }
    assert!(
        left_out.is_empty(),
        "tests/suite.rs does not name these files, so they never run: {left_out:?}"
    );
}

/// Circles allowed by name: a handle and the actor it talks to, documented
/// as one pair in their module's doc (`src/member/mod.rs`).
const ALLOWED_CIRCLES: [(&str, [&str; 2]); 1] = [("src/member", ["actor", "handle"])];

/// The folders whose files are modules from a crate's root: the library's
/// (its binaries aside) and the benchmark's.
fn crate_folders() -> [PathBuf; 2] {
    [root().join("src"), root().join("src/bin/relay-bench")]
}

/// The module path of a file of a crate: `leader/cluster/poll.rs` →
/// `[leader, cluster, poll]`; a `mod.rs` is its folder's module.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The modules a file names through `crate::` and `super::`, as paths from
/// the crate's root.
fn named_modules(source: &str, own: &[String]) -> BTreeSet<Vec<String>> {
    let mut named = BTreeSet::new();
    for path in crate_paths(source) {
        named.insert(path.split("::").map(str::to_string).collect());
    }
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    for (at, _) in code.match_indices("super::") {
        let preceded = code[..at]
            .chars()
            .last()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':');
        if preceded {
            continue; // the second `super` of `super::super::`
        }
        let mut found = BTreeSet::new();
        expand("", &code[at + "super::".len()..], &mut found);
        for path in found {
            let mut parts: Vec<&str> = path.split("::").collect();
            let mut up = 1;
            while parts.first() == Some(&"super") {
                parts.remove(0);
                up += 1;
            }
            let Some(base) = own.len().checked_sub(up) else {
                continue;
            };
            let mut full = own[..base].to_vec();
            full.extend(parts.iter().map(|p| p.to_string()));
            named.insert(full);
        }
    }
    named
}

/// The names of a folder module's children: its files but `mod.rs`, and
/// its subfolders (one node each).
fn children(folder: &Path) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for entry in std::fs::read_dir(folder).into_iter().flatten().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            names.insert(name);
        } else if let Some(stem) = name.strip_suffix(".rs")
            && stem != "mod"
        {
            names.insert(stem.to_string());
        }
    }
    names
}

/// Per folder module, the edges between its children: from → to, with
/// the file and path that make each.
type Graphs =
    std::collections::BTreeMap<PathBuf, std::collections::BTreeMap<(String, String), String>>;

fn sibling_imports() -> Graphs {
    let mut graphs = Graphs::new();
    for crate_folder in crate_folders() {
        for file in rust_files(&crate_folder) {
            let relative = file.strip_prefix(&crate_folder).expect("under the crate");
            if relative.starts_with("bin") {
                continue;
            }
            let own = module_path(relative);
            let source = without_tests(&std::fs::read_to_string(&file).expect("read source"));
            for named in named_modules(&source, &own) {
                let shared = own.iter().zip(&named).take_while(|(a, b)| a == b).count();
                // The hub (the crate's root, a `mod.rs`) is no node; a
                // path into the file's own module is no edge.
                let (Some(from), Some(to)) = (own.get(shared), named.get(shared)) else {
                    continue;
                };
                let folder = own[..shared]
                    .iter()
                    .fold(crate_folder.clone(), |f, p| f.join(p));
                if !children(&folder).contains(to) {
                    continue; // an item of the hub
                }
                let shown = file.strip_prefix(root()).unwrap_or(&file).display();
                graphs
                    .entry(folder)
                    .or_default()
                    .entry((from.clone(), to.clone()))
                    .or_insert_with(|| format!("{shown} names {}", named.join("::")));
            }
        }
    }
    graphs
}

/// The shortest circle through `start`, if there is one.
fn circle_through(edges: &BTreeSet<(String, String)>, start: &str) -> Option<Vec<String>> {
    let mut paths = std::collections::VecDeque::from([vec![start.to_string()]]);
    let mut seen = BTreeSet::new();
    while let Some(path) = paths.pop_front() {
        let last = path.last().expect("a path is never empty");
        for (_, to) in edges.iter().filter(|(from, _)| from == last) {
            if to == start {
                let mut circle = path.clone();
                circle.push(to.clone());
                return Some(circle);
            }
            if seen.insert(to.clone()) {
                let mut longer = path.clone();
                longer.push(to.clone());
                paths.push_back(longer);
            }
        }
    }
    None
}

fn circles(graphs: &Graphs) -> Vec<String> {
    let mut found = Vec::new();
    for (folder, edges) in graphs {
        let shown = folder
            .strip_prefix(root())
            .unwrap_or(folder)
            .display()
            .to_string();
        let allowed: Vec<&[&str; 2]> = ALLOWED_CIRCLES
            .iter()
            .filter(|(f, _)| *f == shown)
            .map(|(_, pair)| pair)
            .collect();
        let graph: BTreeSet<(String, String)> = edges
            .keys()
            .filter(|(from, to)| {
                !allowed
                    .iter()
                    .any(|pair| pair.contains(&from.as_str()) && pair.contains(&to.as_str()))
            })
            .cloned()
            .collect();
        let mut reported = BTreeSet::new();
        let nodes: BTreeSet<&String> = graph.iter().map(|(from, _)| from).collect();
        for node in nodes {
            let Some(circle) = circle_through(&graph, node) else {
                continue;
            };
            let mut members: Vec<String> = circle.iter().skip(1).cloned().collect();
            members.sort();
            if !reported.insert(members) {
                continue;
            }
            let why: Vec<&str> = circle
                .windows(2)
                .map(|w| edges[&(w[0].clone(), w[1].clone())].as_str())
                .collect();
            found.push(format!(
                "{shown}/: {} ({})",
                circle.join(" → "),
                why.join("; ")
            ));
        }
    }
    found
}

/// Files of one module form no circle: a module's files are layered, so
/// each can be read knowing only the ones below it.
#[test]
fn no_import_circle_between_the_files_of_a_module() {
    let found = circles(&sibling_imports());
    assert!(
        found.is_empty(),
        "import circles between the files of one module:\n{}",
        found.join("\n")
    );
}

/// The leader's map (ARCHITECTURE.md, *The leader*): each of its files
/// (a folder by its name) and the siblings it may name.
fn leader_map() -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).expect("ARCHITECTURE.md");
    let section = text
        .split("## The leader\n")
        .nth(1)
        .expect("a section on the leader")
        .split("\n## ")
        .next()
        .unwrap_or_default();
    let mut map = std::collections::BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
        let [file, _, may] = cells[..] else {
            continue;
        };
        let name = ticked(file).concat();
        let name = name
            .trim_end_matches('/')
            .trim_end_matches(".rs")
            .to_string();
        map.insert(name, ticked(may).into_iter().collect());
    }
    map
}

/// The leader's flows call each other in one direction: a file names only
/// the siblings its row of the leader's map allows, and every file has a
/// row, so a new door between two flows is a change to the map a reader
/// sees.
#[test]
fn the_leaders_files_name_only_what_its_map_allows() {
    let map = leader_map();
    let folder = root().join("src/leader");
    let mut missing: Vec<String> = children(&folder)
        .into_iter()
        .filter(|child| !map.contains_key(child))
        .collect();
    missing.sort();
    assert!(
        missing.is_empty(),
        "not on ARCHITECTURE.md's map of the leader: {missing:?}"
    );
    let graphs = sibling_imports();
    let edges = graphs.get(&folder).cloned().unwrap_or_default();
    let unlisted: Vec<String> = edges
        .iter()
        .filter(|((from, to), _)| !map.get(from).is_some_and(|may| may.contains(to)))
        .map(|((from, to), why)| format!("{from} → {to} ({why})"))
        .collect();
    assert!(
        unlisted.is_empty(),
        "the leader's files name siblings their row of ARCHITECTURE.md's map does not allow:\n{}",
        unlisted.join("\n")
    );
}

#[test]
fn citations_are_paths_with_their_items_and_patterns_are_not() {
    let text = "See `src/leader/outbox.rs::call` and (docs/CLUSTER.md).\n\
                | x | `tests/bus.rs::a`, `b`; `tests/host.rs` |\n\
                `src/…`, `src/<module>.rs::<test>`, `src/framing.rs::*`, fuzz/corpus/x\n\
                `session/dialog.rs::Options`, `nowhere/x.rs`, `outbox.rs`, a/src/x.rs";
    let found: Vec<(usize, String, Option<String>)> = citations(text, &["src".into()])
        .into_iter()
        .map(|c| (c.line, c.path, c.item))
        .collect();
    let item = |s: &str| Some(s.to_string());
    assert_eq!(
        found,
        [
            (1, "src/leader/outbox.rs".into(), item("call")),
            (1, "docs/CLUSTER.md".into(), None),
            (2, "tests/bus.rs".into(), item("a")),
            (2, "tests/bus.rs".into(), item("b")),
            (2, "tests/host.rs".into(), None),
            (4, "src/session/dialog.rs".into(), item("Options")),
        ]
    );
}

#[test]
fn an_item_is_defined_only_by_its_own_name() {
    let source = "pub(crate) async fn call_here() {}\nstruct Batch;\nimpl Leader {}";
    assert!(defines(source, "call_here"));
    assert!(defines(source, "Batch") && defines(source, "Leader"));
    assert!(!defines(source, "call") && !defines(source, "Bat"));
}

#[test]
fn super_and_crate_paths_name_modules_from_the_crates_root() {
    let own: Vec<String> = ["leader", "cluster", "poll"].map(String::from).into();
    let source = "use super::super::batch::Batch;\n\
                  use super::{node::ClusterNode, Leader};\n\
                  use crate::store::Store;\n\
                  pub(super) fn f() {}";
    let named: Vec<String> = named_modules(source, &own)
        .into_iter()
        .map(|p| p.join("::"))
        .collect();
    assert_eq!(
        named,
        [
            "leader::batch::Batch",
            "leader::cluster::Leader",
            "leader::cluster::node::ClusterNode",
            "store::Store"
        ]
    );
}

#[test]
fn a_circle_is_found_and_an_allowed_pair_is_not_one() {
    let edge = |from: &str, to: &str| ((from.to_string(), to.to_string()), format!("{from}→{to}"));
    let folder = |name: &str| root().join(name);
    let graphs: Graphs = [
        (
            folder("src/session"),
            [
                edge("outbound", "unsent"),
                edge("unsent", "outbound"),
                edge("mod_a", "unsent"),
            ]
            .into(),
        ),
        (
            folder("src/member"),
            [edge("handle", "actor"), edge("actor", "handle")].into(),
        ),
        (
            folder("src/leader"),
            [edge("batch", "triage"), edge("poller", "batch")].into(),
        ),
    ]
    .into();
    let found = circles(&graphs);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(
        found[0].starts_with("src/session/: outbound → unsent → outbound"),
        "{found:?}"
    );
}

/// Tasks are spawned through `src/tasks.rs`, which boxes the future first:
/// a `tokio::spawn` of an unboxed future compiles tokio's task machinery
/// once more (about 2.5k lines of LLVM IR each; 15 % of the crate when two
/// hundred did). The benchmark's binary is its own crate and may.
#[test]
fn tasks_are_spawned_boxed() {
    let mut unboxed = Vec::new();
    for file in rust_files(&root().join("src")) {
        let shown = file
            .strip_prefix(root())
            .unwrap_or(&file)
            .display()
            .to_string();
        if shown == "src/tasks.rs" || shown.starts_with("src/bin/") {
            continue;
        }
        let source = std::fs::read_to_string(&file).expect("read source");
        for (n, line) in source.lines().enumerate() {
            if line.contains("tokio::spawn(") || line.contains("tokio::task::spawn(") {
                unboxed.push(format!("{shown}:{}: {}", n + 1, line.trim()));
            }
        }
    }
    assert!(
        unboxed.is_empty(),
        "spawn through crate::tasks::spawn (src/tasks.rs says why):\n{}",
        unboxed.join("\n")
    );
}

/// Files that still call the C library themselves, each with its reason.
const LIBC_ELSEWHERE: [(&str, &str); 0] = [];

/// The C library is called from `src/sys.rs` alone, so every `unsafe` of
/// the crate is there with its reason (tests may do as they like). The
/// benchmark's binary is its own crate and may.
#[test]
fn libc_is_called_in_one_module() {
    let mut elsewhere = Vec::new();
    for file in rust_files(&root().join("src")) {
        let shown = shown(&file);
        if shown == "src/sys.rs"
            || shown.starts_with("src/bin/")
            || is_test_file(&file)
            || LIBC_ELSEWHERE.iter().any(|(f, _)| *f == shown)
        {
            continue;
        }
        let source = without_tests(&std::fs::read_to_string(&file).expect("read source"));
        for (n, line) in source.lines().enumerate() {
            let code = line.trim_start();
            if code.starts_with("//") {
                continue;
            }
            let is_unsafe = code
                .split(|c: char| !(c.is_alphanumeric() || c == '_'))
                .any(|word| word == "unsafe");
            if code.contains("libc::") || is_unsafe {
                elsewhere.push(format!("{shown}:{}: {code}", n + 1));
            }
        }
    }
    assert!(
        elsewhere.is_empty(),
        "call the C library through src/sys.rs:\n{}",
        elsewhere.join("\n")
    );
}

/// The most lines a function of the crate may have (its `fn` line to its
/// closing brace, counted as they are: comments and blank lines too). Test
/// code has no limit.
const LONGEST_FUNCTION: usize = 80;

/// Longer functions allowed by name (file, function, why), each until it
/// is split: a function on this list that is short again fails the test
/// below, so the list stays true.
const LONG_FUNCTIONS: [(&str, &str, &str); 0] = [];

/// `source` with every comment, string and character literal blanked
/// (newlines kept), so that braces and `fn` are only code's.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = chars.clone();
    let blank = |out: &mut Vec<char>, from: usize, to: usize| {
        for c in &mut out[from..to.min(chars.len())] {
            if *c != '\n' {
                *c = ' ';
            }
        }
    };
    let at = |i: usize, text: &str| {
        text.chars()
            .enumerate()
            .all(|(k, c)| chars.get(i + k) == Some(&c))
    };
    let mut i = 0;
    while i < chars.len() {
        let word_before = i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_');
        if at(i, "//") {
            let end = (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len());
            blank(&mut out, i, end);
            i = end;
        } else if at(i, "/*") {
            let (mut depth, mut j) = (0, i);
            while j < chars.len() {
                if at(j, "/*") {
                    depth += 1;
                    j += 2;
                } else if at(j, "*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if !word_before && (at(i, "r\"") || at(i, "r#") || at(i, "br\"") || at(i, "br#")) {
            let start = i + if chars[i] == 'b' { 2 } else { 1 };
            let hashes = chars[start..].iter().take_while(|&&c| c == '#').count();
            let closing: String = std::iter::once('"')
                .chain(std::iter::repeat_n('#', hashes))
                .collect();
            let mut j = start + hashes + 1;
            while j < chars.len() && !at(j, &closing) {
                j += 1;
            }
            let end = j + closing.chars().count();
            blank(&mut out, i, end);
            i = end;
        } else if chars[i] == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != '"' {
                j += if chars[j] == '\\' { 2 } else { 1 };
            }
            blank(&mut out, i, j + 1);
            i = j + 1;
        } else if chars[i] == '\'' {
            if chars.get(i + 1) == Some(&'\\') {
                let end = (i + 2..chars.len())
                    .find(|&j| chars[j] == '\'')
                    .unwrap_or(chars.len());
                blank(&mut out, i, end + 1);
                i = end + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                blank(&mut out, i, i + 3);
                i += 3;
            } else {
                i += 1; // a lifetime
            }
        } else {
            i += 1;
        }
    }
    out.into_iter().collect()
}

/// The function a line of code starts, if it starts one: its name (rustfmt
/// puts every `fn` at the start of its line).
fn function_named(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    loop {
        let before = rest;
        if let Some(after) = rest.strip_prefix("pub(")
            && let Some(close) = after.find(')')
        {
            rest = after[close + 1..].trim_start();
        }
        for qualifier in ["pub ", "default ", "const ", "async ", "unsafe ", "extern "] {
            if let Some(after) = rest.strip_prefix(qualifier) {
                rest = after.trim_start();
            }
        }
        if rest == before {
            break;
        }
    }
    let name = rest.strip_prefix("fn ")?.trim_start();
    let end = name
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(name.len());
    (end > 0).then(|| &name[..end])
}

/// Every function with a body in `source` (not test code): its name, the
/// line it starts on (from 1), and its length in lines.
fn functions(source: &str) -> Vec<(String, usize, usize)> {
    let code = code_only(&without_tests(source));
    let starts: Vec<usize> = std::iter::once(0)
        .chain(code.match_indices('\n').map(|(i, _)| i + 1))
        .collect();
    let bytes = code.as_bytes();
    let mut found = Vec::new();
    for (n, line) in code.lines().enumerate() {
        let Some(name) = function_named(line) else {
            continue;
        };
        // The body's `{`, or a `;`: a declaration without one.
        let mut at = starts[n] + line.find("fn ").unwrap_or(0);
        let mut depth = 0i32;
        while at < bytes.len() {
            match bytes[at] {
                b'(' | b'[' => depth += 1,
                b')' | b']' => depth -= 1,
                b'{' | b';' if depth == 0 => break,
                _ => {}
            }
            at += 1;
        }
        if bytes.get(at) != Some(&b'{') {
            continue;
        }
        let mut braces = 0;
        let mut end = at;
        while end < bytes.len() {
            match bytes[end] {
                b'{' => braces += 1,
                b'}' => {
                    braces -= 1;
                    if braces == 0 {
                        break;
                    }
                }
                _ => {}
            }
            end += 1;
        }
        let last = bytes[..end].iter().filter(|&&b| b == b'\n').count();
        found.push((name.to_string(), n + 1, last - n + 1));
    }
    found
}

/// Long functions are split, so each can be read as one thing: none of the
/// crate's is over [`LONGEST_FUNCTION`] lines but those [`LONG_FUNCTIONS`]
/// names, and each of those still is.
#[test]
fn functions_are_at_most_eighty_lines() {
    let mut long = Vec::new();
    let mut listed_and_long = BTreeSet::new();
    for file in rust_files(&root().join("src")) {
        if is_test_file(&file) {
            continue;
        }
        let shown = shown(&file);
        let source = std::fs::read_to_string(&file).expect("read source");
        for (name, line, lines) in functions(&source) {
            if lines <= LONGEST_FUNCTION {
                continue;
            }
            let listed = LONG_FUNCTIONS
                .iter()
                .any(|(f, n, _)| *f == shown && *n == name);
            if listed {
                listed_and_long.insert((shown.clone(), name));
            } else {
                long.push(format!("{shown}:{line}: {name} ({lines} lines)"));
            }
        }
    }
    let short_again: Vec<String> = LONG_FUNCTIONS
        .iter()
        .filter(|(f, n, _)| !listed_and_long.contains(&(f.to_string(), n.to_string())))
        .map(|(f, n, _)| format!("{f}: {n}"))
        .collect();
    assert!(
        long.is_empty(),
        "functions over {LONGEST_FUNCTION} lines (split them):\n{}",
        long.join("\n")
    );
    assert!(
        short_again.is_empty(),
        "listed as long but not over {LONGEST_FUNCTION} lines (take them off LONG_FUNCTIONS):\n{}",
        short_again.join("\n")
    );
}

#[test]
fn a_functions_length_is_its_code_from_fn_to_its_brace() {
    let source = "pub(crate) async fn outer(x: [u8; 2]) -> u8 {\n\
                  \x20   let s = \"}}} fn fake() {\";\n\
                  \x20   let c = '}'; // }\n\
                  \x20   /* { */ x[0]\n\
                  }\n\
                  fn declared(&self);\n\
                  impl T {\n\
                  \x20   fn inner<'a>(&'a self) -> &'a str { r#\"{\"# }\n\
                  }\n\
                  #[cfg(test)]\n\
                  mod tests {\n\
                  \x20   fn long_test() {}\n\
                  }\n";
    assert_eq!(
        functions(source),
        [("outer".to_string(), 1, 5), ("inner".to_string(), 8, 1)]
    );
}
