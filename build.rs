//! Names the commit `agent-relay --version` was built from
//! (`AGENT_RELAY_COMMIT`), so a bug report says which code ran.
//!
//! It asks `git` when the crate is the top of a checkout — a clone, and
//! also `cargo install --git`, which builds from one — and otherwise reads
//! the `.cargo_vcs_info.json` that `cargo package` writes; with neither it
//! says `unknown`. No build dependency: a program and a file, read by hand
//! (docs/decisions/0005-install.md).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let commit = from_git(&dir)
        .or_else(|| from_vcs_info(&dir))
        .unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=AGENT_RELAY_COMMIT={commit}");
}

/// `git -C dir args…`, its trimmed output when it succeeded.
fn git(dir: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        // A build run from a git hook inherits these; they would point git
        // at the hook's repository instead of this one.
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env_remove("GIT_INDEX_FILE")
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let text = text.trim();
    (out.status.success() && !text.is_empty()).then(|| text.to_string())
}

fn from_git(dir: &Path) -> Option<String> {
    // Only our own checkout: a crate unpacked inside another repository (a
    // vendor folder) was not built from that repository's commit.
    let top = PathBuf::from(git(dir, &["rev-parse", "--show-toplevel"])?);
    if top.canonicalize().ok()? != dir.canonicalize().ok()? {
        return None;
    }
    let commit = git(dir, &["rev-parse", "--short=12", "HEAD"])?;
    // Run again when HEAD moves. The reflog of HEAD changes with every
    // commit, checkout and reset of this worktree; the branch's own ref and
    // packed-refs cover a repository without reflogs. Only files that exist
    // are named: cargo reruns a build script on every build for a missing one.
    let mut watched = vec!["HEAD".to_string(), "logs/HEAD".into(), "packed-refs".into()];
    watched.extend(git(dir, &["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(dir, &["rev-parse", "--git-path", &name]) {
            let path = dir.join(path);
            if path.is_file() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    Some(commit)
}

/// The commit `cargo package` recorded: `{"git": {"sha1": "…"}, …}`.
fn from_vcs_info(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(dir.join(".cargo_vcs_info.json")).ok()?;
    let after = text.split("\"sha1\"").nth(1)?;
    let sha: String = after
        .trim_start_matches([' ', ':', '"', '\n', '\t'])
        .chars()
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (sha.len() >= 12).then(|| sha[..12].to_string())
}
