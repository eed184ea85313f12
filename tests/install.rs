//! How the relay is installed and found, run as a user runs it: the version
//! names its commit, the completions parse, the manual covers every
//! command, the Claude Code plugin's launcher finds the binary where a user
//! puts it (and says so when it cannot), and `doctor` tells the plugin from
//! `install claude-code` and refuses both at once.
//!
//! The real hosts install the real packages in `tests/pi/package.test.mjs`
//! and `tests/claude/plugin.test.mjs`.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `program args` with only `env` set (no HOME unless given), stdin
/// closed.
fn run(program: &Path, args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .current_dir(root());
    for (key, value) in env {
        command.env(key, value);
    }
    command
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()))
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The commit as `git` has it, when the tests run in a checkout.
fn head() -> Option<String> {
    let out = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(root())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

#[test]
fn the_version_names_the_commit_it_was_built_from() {
    let out = run(&common::binary(), &["--version"], &[]);
    assert!(out.status.success());
    let commit = head().unwrap_or_else(|| "unknown".into());
    assert_eq!(
        stdout(&out).trim(),
        format!("agent-relay {} ({commit})", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn bash_completions_parse_and_the_manual_has_a_page_per_command() {
    let bash = run(&common::binary(), &["completions", "bash"], &[]);
    assert!(bash.status.success());
    assert!(stdout(&bash).contains("agent-relay"), "{}", stdout(&bash));
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("agent-relay.bash");
    std::fs::write(&script, &bash.stdout).unwrap();
    let parsed = Command::new("bash")
        .arg("-n")
        .arg(&script)
        .output()
        .expect("bash");
    assert!(
        parsed.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&parsed.stderr)
    );
    for shell in ["zsh", "fish"] {
        let out = run(&common::binary(), &["completions", shell], &[]);
        assert!(
            out.status.success() && stdout(&out).contains("agent-relay"),
            "{shell}"
        );
    }

    let page = run(&common::binary(), &["man"], &[]);
    assert!(page.status.success());
    let page = stdout(&page);
    assert!(page.contains(".TH agent-relay 1"), "{page}");
    assert!(page.contains("agent\\-relay\\-setup(1)"), "{page}");
    let pages = dir.path().join("man1");
    let out = run(
        &common::binary(),
        &["man", "--out", pages.to_str().unwrap()],
        &[],
    );
    assert!(out.status.success(), "{out:?}");
    for name in [
        "agent-relay.1",
        "agent-relay-setup.1",
        "agent-relay-doctor.1",
        "agent-relay-install-claude-code.1",
        "agent-relay-completions.1",
    ] {
        assert!(pages.join(name).is_file(), "{name} in {}", stdout(&out));
    }
}

/// `claude-plugin/agent-relay.sh` with only `env` set, as Claude Code runs
/// it for the MCP server and a hook.
fn launcher(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut full: Vec<(&str, &Path)> = vec![("PATH", Path::new("/usr/bin:/bin"))];
    full.extend_from_slice(env);
    let script = root().join("claude-plugin/agent-relay.sh");
    let mut all = vec![script.to_str().unwrap()];
    all.extend_from_slice(args);
    run(Path::new("/bin/sh"), &all, &full)
}

#[test]
fn the_plugins_launcher_finds_the_binary_where_users_put_it_and_says_when_it_cannot() {
    let binary = common::binary();
    let version = format!("agent-relay {}", env!("CARGO_PKG_VERSION"));
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    std::fs::create_dir_all(&home).unwrap();

    // AGENT_RELAY_BIN, a path the user sets.
    let out = launcher(
        &["--version"],
        &[("HOME", &home), ("AGENT_RELAY_BIN", &binary)],
    );
    assert!(stdout(&out).starts_with(&version), "{out:?}");

    // On PATH, after `cargo install` into a folder on it.
    let on_path = dir.path().join("bin");
    std::fs::create_dir_all(&on_path).unwrap();
    std::os::unix::fs::symlink(&binary, on_path.join("agent-relay")).unwrap();
    let path = format!("{}:/usr/bin:/bin", on_path.display());
    let out = launcher(
        &["--version"],
        &[("HOME", &home), ("PATH", Path::new(&path))],
    );
    assert!(stdout(&out).starts_with(&version), "{out:?}");

    // In ~/.cargo/bin, which Claude Code's PATH may lack.
    let cargo_bin = home.join(".cargo/bin");
    std::fs::create_dir_all(&cargo_bin).unwrap();
    std::os::unix::fs::symlink(&binary, cargo_bin.join("agent-relay")).unwrap();
    let out = launcher(&["--version"], &[("HOME", &home)]);
    assert!(stdout(&out).starts_with(&version), "{out:?}");
    assert_eq!(
        agent_relay_finds(None, "/usr/bin:/bin", &home),
        Ok(cargo_bin.join("agent-relay")),
        "the doctor looks where the launcher does"
    );
    std::fs::remove_file(cargo_bin.join("agent-relay")).unwrap();

    // In npm's global prefix (`npm i -g agent-relay`), named by ~/.npmrc
    // as `npm config set prefix ~/.npm-global` writes it.
    let npm_bin = home.join(".npm-global/bin");
    std::fs::create_dir_all(&npm_bin).unwrap();
    std::os::unix::fs::symlink(&binary, npm_bin.join("agent-relay")).unwrap();
    std::fs::write(home.join(".npmrc"), "fund=false\nprefix = ~/.npm-global\n").unwrap();
    let out = launcher(&["--version"], &[("HOME", &home)]);
    assert!(stdout(&out).starts_with(&version), "{out:?}");
    assert_eq!(
        agent_relay_finds(None, "/usr/bin:/bin", &home),
        Ok(npm_bin.join("agent-relay")),
        "the doctor looks in npm's prefix as the launcher does"
    );
    std::fs::remove_file(npm_bin.join("agent-relay")).unwrap();
    std::fs::remove_file(home.join(".npmrc")).unwrap();

    // Nowhere: SessionStart tells the user, the MCP server fails saying
    // why, the other hooks decide nothing.
    let out = launcher(&["hook", "SessionStart"], &[("HOME", &home)]);
    assert!(out.status.success(), "{out:?}");
    let said: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("JSON for Claude Code");
    let message = said["systemMessage"].as_str().unwrap_or_default();
    assert!(
        message.starts_with("agent-relay is not installed")
            && message.contains("cargo install --locked")
            && message.contains("AGENT_RELAY_BIN"),
        "{message}"
    );
    let out = launcher(&["hook", "Stop"], &[("HOME", &home)]);
    assert!(out.status.success() && out.stdout.is_empty(), "{out:?}");
    let out = launcher(&["mcp"], &[("HOME", &home)]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("agent-relay is not installed"),
        "{out:?}"
    );
    assert!(agent_relay_finds(None, "/usr/bin:/bin", &home).is_err());

    // A path set but wrong is named.
    let wrong = dir.path().join("no-such-agent-relay");
    let out = launcher(
        &["hook", "SessionStart"],
        &[("HOME", &home), ("AGENT_RELAY_BIN", &wrong)],
    );
    assert!(stdout(&out).contains("no-such-agent-relay"), "{out:?}");
    assert!(agent_relay_finds(Some(&wrong), "", &home).is_err_and(|why| why.contains("no-such")));
}

/// What `doctor` says the plugin would run, through the doctor itself.
fn agent_relay_finds(bin: Option<&Path>, path: &str, home: &Path) -> Result<PathBuf, String> {
    let mut env: Vec<(&str, &Path)> = vec![("HOME", home), ("PATH", Path::new(path))];
    if let Some(bin) = bin {
        env.push(("AGENT_RELAY_BIN", bin));
    }
    let plugged = tempfile::tempdir().unwrap();
    let config = plugged.path().join("claude");
    write_plugin_records(&config, true);
    env.push(("CLAUDE_CONFIG_DIR", &config));
    env.push(("AGENT_RELAY_HOME", plugged.path()));
    let out = run(&common::binary(), &["doctor"], &env);
    let text = stdout(&out);
    let line = text
        .lines()
        .find(|l| l.contains("Claude Code:"))
        .unwrap_or_else(|| panic!("a Claude Code line in {text}"));
    match line.split_once(" is enabled and runs ") {
        Some((_, path)) => Ok(PathBuf::from(path)),
        None => Err(line.to_string()),
    }
}

/// The plugin as `claude plugin install agent-relay@agent-relay` records it
/// (Claude Code 2.1.332): enabled in the settings, its copy in the record.
fn write_plugin_records(config: &Path, enabled: bool) {
    std::fs::create_dir_all(config.join("plugins")).unwrap();
    std::fs::write(
        config.join("settings.json"),
        serde_json::json!({"enabledPlugins": {"agent-relay@agent-relay": enabled}}).to_string(),
    )
    .unwrap();
    std::fs::write(
        config.join("plugins/installed_plugins.json"),
        serde_json::json!({"version": 2, "plugins": {"agent-relay@agent-relay": [{
            "scope": "user",
            "installPath": config.join("plugins/cache/agent-relay/agent-relay/1a2b3c4d5e6f"),
            "version": "1a2b3c4d5e6f",
        }]}})
        .to_string(),
    )
    .unwrap();
}

#[test]
fn doctor_tells_the_plugin_from_install_claude_code_and_refuses_both() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("home");
    let config = home.join(".claude");
    std::fs::create_dir_all(&home).unwrap();
    let relay = dir.path().join("relay");
    let binary = common::binary();
    let env = [
        ("HOME", home.as_path()),
        ("AGENT_RELAY_HOME", relay.as_path()),
        ("AGENT_RELAY_BIN", binary.as_path()),
    ];
    let doctor = || {
        let text = stdout(&run(&common::binary(), &["doctor"], &env));
        text.lines()
            .filter(|l| l.contains("Claude Code:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(doctor().contains("Claude Code: not added"), "{}", doctor());

    let out = run(&common::binary(), &["install", "claude-code"], &env);
    assert!(out.status.success(), "{out:?}");
    let said = doctor();
    assert!(
        said.starts_with("✓ Claude Code: added by `agent-relay install claude-code`"),
        "{said}"
    );

    // The plugin beside it: two MCP servers per session, hooks twice.
    let settings = std::fs::read_to_string(config.join("settings.json")).unwrap();
    let mut settings: serde_json::Value = serde_json::from_str(&settings).unwrap();
    settings["enabledPlugins"] = serde_json::json!({"agent-relay@agent-relay": true});
    write_plugin_records(&config, true);
    std::fs::write(config.join("settings.json"), settings.to_string()).unwrap();
    let said = doctor();
    assert!(said.starts_with("✗ Claude Code: both the plugin agent-relay@agent-relay and `agent-relay install claude-code` are active"), "{said}");
    assert!(
        said.contains("agent-relay install claude-code --remove"),
        "{said}"
    );

    let out = run(
        &common::binary(),
        &["install", "claude-code", "--remove"],
        &env,
    );
    assert!(out.status.success(), "{out:?}");
    let said = doctor();
    assert_eq!(
        said,
        format!(
            "✓ Claude Code: the plugin agent-relay@agent-relay 1a2b3c4d5e6f is enabled and runs {}",
            binary.display()
        )
    );
    assert!(!said.contains("install claude-code"), "{said}");
}

/// The repository is the pi package (pi-coding-agent's docs/packages.md):
/// its `pi` key names the extension, its version is the crate's, and pi's
/// own modules are optional peers, so the `npm install` pi runs in a git
/// clone fetches nothing (npm installs required peers).
#[test]
fn the_repository_is_a_pi_package_holding_the_extension() {
    let text = std::fs::read_to_string(root().join("package.json")).unwrap();
    let package: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(package["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(
        package["pi"]["extensions"],
        serde_json::json!(["./scripts/pi-extension.ts"])
    );
    assert!(root().join("scripts/pi-extension.ts").is_file());
    let peers = package["peerDependencies"].as_object().unwrap();
    assert!(!peers.is_empty());
    for name in peers.keys() {
        assert_eq!(
            package["peerDependenciesMeta"][name]["optional"], true,
            "{name}"
        );
    }
    for key in ["dependencies", "devDependencies"] {
        assert!(package.get(key).is_none(), "{key}: nothing to install");
    }
}
