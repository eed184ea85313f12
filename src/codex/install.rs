//! `agent-relay install codex`: the hooks for plain `codex` ([`super::hook`])
//! in the user's `$CODEX_HOME/hooks.json` (`~/.codex/hooks.json`), merged
//! into what is there — the user's own hooks stay, in their order, ours are
//! added once — and trusted the way Codex documents it.
//!
//! Codex runs a hook only once it is trusted: `hooks.state.<key>.trusted_hash`
//! in its `config.toml` holds the hash of what the user trusted, and a hook
//! whose hash differs is skipped, silently. Install asks Codex itself for
//! the keys and hashes (`hooks/list` on a `codex app-server` it runs on
//! stdio) and has Codex write them (`config/batchWrite`, which keeps the
//! rest of the file), for the relay's own hooks only. Running it again
//! changes nothing; `--remove` takes the hooks out (the trust entries of
//! hooks that are gone do nothing, and Codex's file is left to Codex).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::hook::HOOKS;
use super::wire;
use super::{AppServer, AppServerError, Transport};
use crate::paths::shell_quote;
use crate::settings_file::{InstallError, check_target, read_object, write_object};

/// How long Codex's app-server may take to answer while installing.
const CODEX_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum CodexInstallError {
    #[error(transparent)]
    File(#[from] InstallError),
    #[error("cannot run {program} to trust the hooks: {source}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "the hooks are written, but Codex could not be asked to trust them ({0}); run install again, or trust them in Codex (/hooks)"
    )]
    Trust(#[from] AppServerError),
}

/// Where Codex keeps the user's hooks.
pub struct Targets {
    /// `CODEX_HOME`, else `~/.codex`.
    pub codex_home: PathBuf,
}

impl Targets {
    pub fn from_env(home: &Path) -> Self {
        Self {
            codex_home: std::env::var_os("CODEX_HOME")
                .filter(|d| !d.is_empty())
                .map_or_else(|| home.join(".codex"), PathBuf::from),
        }
    }

    pub fn hooks(&self) -> PathBuf {
        self.codex_home.join("hooks.json")
    }
}

/// The command of one of our hooks.
fn command(exe: &str, event: &str) -> String {
    format!("{} hook --host codex {event}", shell_quote(exe))
}

fn hook_group(exe: &str, event: &str, timeout: u32) -> Value {
    json!({"hooks": [{"type": "command", "command": command(exe, event), "timeout": timeout}]})
}

/// Whether a command is one of our hooks (from any install of the relay).
fn is_ours(command: &str) -> bool {
    command.contains("agent-relay") && command.contains(" hook --host codex ")
}

fn ours(group: &Value) -> bool {
    group["hooks"].as_array().is_some_and(|hooks| {
        hooks
            .iter()
            .any(|h| h["command"].as_str().is_some_and(is_ours))
    })
}

/// Adds what is missing; returns the lines that say what changed.
pub fn merge_hooks(file: &mut Map<String, Value>, exe: &str) -> Vec<String> {
    let mut changes = Vec::new();
    let hooks = file
        .entry("hooks")
        .or_insert_with(|| Value::Object(Map::new()));
    if !hooks.is_object() {
        *hooks = Value::Object(Map::new());
        changes.push("~ hooks was not an object; replaced".into());
    }
    let Some(hooks) = hooks.as_object_mut() else {
        return changes;
    };
    for (event, timeout) in HOOKS {
        let groups = hooks.entry(event).or_insert_with(|| json!([]));
        if !groups.is_array() {
            *groups = json!([]);
        }
        let Some(groups) = groups.as_array_mut() else {
            continue;
        };
        let wanted = hook_group(exe, event, timeout);
        match groups.iter().position(ours) {
            Some(i) if groups[i] == wanted => {}
            Some(i) => {
                groups[i] = wanted;
                changes.push(format!("~ hooks.{event}: {}", command(exe, event)));
            }
            None => {
                groups.push(wanted);
                changes.push(format!("+ hooks.{event}: {}", command(exe, event)));
            }
        }
    }
    changes
}

/// Removes our hook groups; an event left with no group goes too.
pub fn unmerge_hooks(file: &mut Map<String, Value>) -> Vec<String> {
    let mut changes = Vec::new();
    let Some(hooks) = file.get_mut("hooks").and_then(Value::as_object_mut) else {
        return changes;
    };
    for (event, _) in HOOKS {
        let Some(groups) = hooks.get_mut(event).and_then(Value::as_array_mut) else {
            continue;
        };
        let before = groups.len();
        groups.retain(|g| !ours(g));
        if groups.len() != before {
            changes.push(format!("- hooks.{event}"));
        }
        if groups.is_empty() {
            hooks.remove(event);
        }
    }
    changes
}

/// Installs (or with `dry_run`, shows) the hooks and trusts them, asking
/// `codex` (the program); returns what it says to the user.
pub async fn install(
    targets: &Targets,
    exe: &str,
    codex: &Path,
    dry_run: bool,
) -> Result<String, CodexInstallError> {
    let path = check_target(&targets.hooks())?;
    let mut file = read_object(&path)?;
    let changes = merge_hooks(&mut file, exe);
    let mut said = String::new();
    for change in &changes {
        said.push_str(change);
        said.push('\n');
    }
    if dry_run {
        said.push_str(&match changes.is_empty() {
            true => format!("{} has the relay's hooks already.\n", path.display()),
            false => format!(
                "Would write {} and have Codex trust these hooks (--dry-run: nothing written).\n",
                path.display()
            ),
        });
        return Ok(said);
    }
    if !changes.is_empty() {
        write_object(&path, &file)?;
        said.push_str(&format!("Wrote {}.\n", path.display()));
    }
    let trusted = trust(codex, &targets.codex_home, exe).await?;
    said.push_str(&match trusted {
        0 => "Codex trusts the relay's hooks already.\n".to_string(),
        n => format!("Codex now trusts the relay's {n} hooks.\n"),
    });
    if changes.is_empty() && trusted == 0 {
        said.push_str("Nothing to change.\n");
    } else {
        said.push_str("New Codex sessions relay to Telegram: the topic at start, each turn's answer, and the approvals [approvals] asks about. A message from the phone cannot start a turn this way; run `agent-relay codex` for that.\n");
    }
    Ok(said)
}

/// Takes out (or with `dry_run`, shows) what [`install`] added.
pub fn remove(targets: &Targets, dry_run: bool) -> Result<String, CodexInstallError> {
    let path = check_target(&targets.hooks())?;
    let mut file = read_object(&path)?;
    let changes = unmerge_hooks(&mut file);
    let mut said: String = changes.iter().map(|c| format!("{c}\n")).collect();
    if changes.is_empty() {
        said.push_str(&format!(
            "{} has none of the relay's hooks.\n",
            path.display()
        ));
    } else if dry_run {
        said.push_str(&format!(
            "Would write {} (--dry-run: nothing written).\n",
            path.display()
        ));
    } else {
        write_object(&path, &file)?;
        said.push_str(&format!("Wrote {}.\n", path.display()));
    }
    Ok(said)
}

/// Has Codex trust the relay's hooks that it does not trust yet; how many.
async fn trust(codex: &Path, codex_home: &Path, exe: &str) -> Result<usize, CodexInstallError> {
    let mut server = tokio::process::Command::new(codex)
        .arg("app-server")
        .env_clear()
        .envs(crate::config::child_env(std::env::vars_os()))
        .env("CODEX_HOME", codex_home)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CodexInstallError::Spawn {
            program: codex.display().to_string(),
            source,
        })?;
    let (Some(stdin), Some(stdout)) = (server.stdin.take(), server.stdout.take()) else {
        return Err(CodexInstallError::Spawn {
            program: codex.display().to_string(),
            source: std::io::Error::other("no pipes to the app-server"),
        });
    };
    let (client, _incoming) = AppServer::start(Transport::stdio(stdout, stdin));
    let trusted = trust_on(&client, codex_home, exe).await;
    drop(client);
    let _ = server.start_kill();
    let _ = server.wait().await;
    trusted
}

async fn trust_on(
    client: &AppServer,
    codex_home: &Path,
    exe: &str,
) -> Result<usize, CodexInstallError> {
    client.initialize("agent-relay-install").await?;
    // User-level hooks apply in every folder; any folder lists them.
    let listed: wire::HooksList = client
        .request(
            wire::method::HOOKS_LIST,
            &wire::HooksListParams {
                cwds: vec![codex_home.display().to_string()],
            },
            CODEX_WAIT,
        )
        .await?;
    let wanted: Vec<String> = HOOKS.iter().map(|(event, _)| command(exe, event)).collect();
    let untrusted: Map<String, Value> = listed
        .data
        .iter()
        .flat_map(|folder| &folder.hooks)
        .filter(|hook| hook.command.as_ref().is_some_and(|c| wanted.contains(c)))
        .filter(|hook| hook.trust_status != "trusted")
        .map(|hook| (hook.key.clone(), json!({"trusted_hash": hook.current_hash})))
        .collect();
    if untrusted.is_empty() {
        return Ok(0);
    }
    let _: Value = client
        .request(
            wire::method::CONFIG_BATCH_WRITE,
            &wire::ConfigBatchWrite {
                edits: vec![wire::ConfigEdit {
                    key_path: "hooks.state".into(),
                    value: Value::Object(untrusted.clone()),
                    merge_strategy: "upsert",
                }],
                reload_user_config: false,
            },
            CODEX_WAIT,
        )
        .await?;
    Ok(untrusted.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_keeps_the_users_hooks_in_order_and_is_idempotent() {
        let mut file: Map<String, Value> = serde_json::from_value(json!({
            "hooks": {
                "Stop": [{"hooks": [{"type": "command", "command": "notify-send done"}]}],
                "PreToolUse": [{"matcher": "Bash", "hooks": [{"type": "command", "command": "audit"}]}]
            },
            "other": 1
        }))
        .unwrap();
        let exe = "/home/ada/.cargo/bin/agent-relay";
        let changes = merge_hooks(&mut file, exe);
        assert_eq!(changes.len(), 3, "{changes:?}");
        let stop = file["hooks"]["Stop"].as_array().unwrap();
        assert_eq!(stop[0]["hooks"][0]["command"], "notify-send done");
        assert_eq!(
            stop[1]["hooks"][0]["command"],
            "/home/ada/.cargo/bin/agent-relay hook --host codex Stop"
        );
        assert_eq!(file["hooks"]["PreToolUse"][0]["matcher"], "Bash");
        assert_eq!(file["other"], 1);
        let keys: Vec<&String> = file["hooks"].as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            ["Stop", "PreToolUse", "SessionStart", "PermissionRequest"]
        );
        assert!(
            merge_hooks(&mut file, exe).is_empty(),
            "a rerun changes nothing"
        );
        // A moved binary is updated in place, not added twice.
        let changes = merge_hooks(&mut file, "/opt/agent-relay/agent-relay");
        assert!(changes.iter().all(|c| c.starts_with('~')), "{changes:?}");
        assert_eq!(file["hooks"]["Stop"].as_array().unwrap().len(), 2);

        let removed = unmerge_hooks(&mut file);
        assert_eq!(removed.len(), 3);
        assert_eq!(file["hooks"]["Stop"].as_array().unwrap().len(), 1);
        assert!(file["hooks"].get("SessionStart").is_none());
        assert!(unmerge_hooks(&mut file).is_empty());
    }
}
