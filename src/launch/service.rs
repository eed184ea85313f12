//! `agent-relay install service` (docs/DESIGN.md, *Launching*, "Keeping
//! serve running"): a systemd user unit on Linux, enabled and started; a
//! launchd agent on macOS, loaded. The other kind can be asked for by
//! name (`--launchd`, `--systemd`): it is then written, never loaded, so
//! the text can be read and tested anywhere. `--dry-run` shows the file
//! and the commands; `--remove` undoes exactly that.
//!
//! The unit carries `PATH` (a service starts with a bare one, and `serve`
//! must find `pi`, `claude` and `node`) and `AGENT_RELAY_HOME` when it is
//! set — never the bot token: `serve` reads it from `config.toml`.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What keeps `serve` running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Manager {
    /// A systemd user unit.
    Systemd,
    /// A launchd agent.
    Launchd,
}

impl Manager {
    /// This system's own.
    pub fn native() -> Self {
        if cfg!(target_os = "macos") {
            Self::Launchd
        } else {
            Self::Systemd
        }
    }
}

/// The service file, where it goes and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unit {
    pub manager: Manager,
    pub path: PathBuf,
    pub text: String,
}

/// The systemd unit's name.
pub const SYSTEMD_UNIT: &str = "agent-relay.service";
/// The launchd agent's label.
pub const LAUNCHD_LABEL: &str = "dev.agent-relay.serve";

/// Why the service could not be installed or removed.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    #[error("cannot write {}: {source}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove {}: {source}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// The unit for `manager`: `exe serve`, with `env` (name, value) set.
/// `config_home` is `$XDG_CONFIG_HOME` or `~/.config`; `home` the home.
pub fn unit(
    manager: Manager,
    exe: &Path,
    home: &Path,
    config_home: &Path,
    env: &[(String, String)],
) -> Unit {
    match manager {
        Manager::Systemd => Unit {
            manager,
            path: config_home.join("systemd/user").join(SYSTEMD_UNIT),
            text: systemd_text(exe, env),
        },
        Manager::Launchd => Unit {
            manager,
            path: home
                .join("Library/LaunchAgents")
                .join(format!("{LAUNCHD_LABEL}.plist")),
            text: launchd_text(exe, home, env),
        },
    }
}

/// A value as systemd reads it inside double quotes (`%` is a specifier).
fn systemd_quoted(value: &str) -> String {
    let escaped = value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('%', "%%");
    format!("\"{escaped}\"")
}

fn systemd_text(exe: &Path, env: &[(String, String)]) -> String {
    let mut text = String::from(
        "# agent-relay serve: agent sessions started from Telegram (agent-relay install service).\n\
         # The bot token is read from config.toml, never kept here.\n\
         [Unit]\n\
         Description=agent-relay serve: agent sessions started from Telegram\n\
         After=network-online.target\n\
         Wants=network-online.target\n\
         \n\
         [Service]\n\
         Type=simple\n",
    );
    text.push_str(&format!(
        "ExecStart={} serve\n",
        systemd_quoted(&exe.display().to_string())
    ));
    for (key, value) in env {
        text.push_str(&format!(
            "Environment={}\n",
            systemd_quoted(&format!("{key}={value}"))
        ));
    }
    text.push_str(
        "Restart=on-failure\n\
         RestartSec=5\n\
         # serve ends its agents itself; they come back with it.\n\
         KillMode=mixed\n\
         TimeoutStopSec=30\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
    );
    text
}

fn xml(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

fn launchd_text(exe: &Path, home: &Path, env: &[(String, String)]) -> String {
    let mut vars = String::new();
    for (key, value) in env {
        vars.push_str(&format!(
            "    <key>{}</key>\n    <string>{}</string>\n",
            xml(key),
            xml(value)
        ));
    }
    let log = home.join("Library/Logs/agent-relay-serve.log");
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<!-- agent-relay serve: agent sessions started from Telegram (agent-relay install service).
     The bot token is read from config.toml, never kept here. -->
<plist version="1.0">
<dict>
  <key>Label</key>
  <string>{LAUNCHD_LABEL}</string>
  <key>ProgramArguments</key>
  <array>
    <string>{}</string>
    <string>serve</string>
  </array>
  <key>EnvironmentVariables</key>
  <dict>
{vars}  </dict>
  <key>RunAtLoad</key>
  <true/>
  <key>KeepAlive</key>
  <dict>
    <key>SuccessfulExit</key>
    <false/>
  </dict>
  <key>StandardErrorPath</key>
  <string>{}</string>
</dict>
</plist>
"#,
        xml(&exe.display().to_string()),
        xml(&log.display().to_string())
    )
}

/// The commands that load (`load`) or unload the unit; none when the
/// unit is not this system's kind.
pub fn commands(unit: &Unit, load: bool) -> Vec<Vec<String>> {
    if unit.manager != Manager::native() {
        return Vec::new();
    }
    let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let path = unit.path.display().to_string();
    match (unit.manager, load) {
        (Manager::Systemd, true) => vec![
            words(&["systemctl", "--user", "daemon-reload"]),
            words(&["systemctl", "--user", "enable", "--now", SYSTEMD_UNIT]),
        ],
        (Manager::Systemd, false) => vec![
            words(&["systemctl", "--user", "disable", "--now", SYSTEMD_UNIT]),
            words(&["systemctl", "--user", "daemon-reload"]),
        ],
        (Manager::Launchd, true) => vec![words(&["launchctl", "load", "-w", &path])],
        (Manager::Launchd, false) => vec![words(&["launchctl", "unload", "-w", &path])],
    }
}

/// What running one command came to: `None` when it worked, else why not.
fn run(command: &[String]) -> Option<String> {
    let (program, args) = command.split_first()?;
    match Command::new(program).args(args).output() {
        Ok(out) if out.status.success() => None,
        Ok(out) => Some(format!(
            "{} failed ({}): {}",
            command.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )),
        Err(e) => Some(format!("cannot run {}: {e}", command.join(" "))),
    }
}

/// What installing or removing came to: what was done, and what failed
/// (with what to run by hand).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Done {
    pub said: String,
    pub failed: bool,
}

/// Writes the unit and loads it (see the module docs).
pub fn install(unit: &Unit, dry_run: bool) -> Result<Done, ServiceError> {
    let commands = commands(unit, true);
    let mut said = String::new();
    if dry_run {
        said.push_str(&format!(
            "would write {}:\n{}\n",
            unit.path.display(),
            unit.text
        ));
        for command in &commands {
            said.push_str(&format!("would run: {}\n", command.join(" ")));
        }
        return Ok(Done {
            said,
            failed: false,
        });
    }
    if let Some(dir) = unit.path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ServiceError::Write {
            path: dir.to_path_buf(),
            source,
        })?;
    }
    crate::paths::replace_file(&unit.path, unit.text.as_bytes(), 0o644).map_err(|source| {
        ServiceError::Write {
            path: unit.path.clone(),
            source,
        }
    })?;
    said.push_str(&format!("wrote {}\n", unit.path.display()));
    if commands.is_empty() {
        said.push_str("not loaded: it is not this system's kind of service\n");
        return Ok(Done {
            said,
            failed: false,
        });
    }
    Ok(run_all(&commands, said))
}

/// Unloads the unit and removes its file.
pub fn remove(unit: &Unit, dry_run: bool) -> Result<Done, ServiceError> {
    let commands = commands(unit, false);
    if dry_run {
        let mut said = String::new();
        for command in &commands {
            said.push_str(&format!("would run: {}\n", command.join(" ")));
        }
        said.push_str(&format!("would remove {}\n", unit.path.display()));
        return Ok(Done {
            said,
            failed: false,
        });
    }
    if !unit.path.exists() {
        return Ok(Done {
            said: format!(
                "nothing to remove: {} does not exist\n",
                unit.path.display()
            ),
            failed: false,
        });
    }
    let done = run_all(&commands, String::new());
    std::fs::remove_file(&unit.path).map_err(|source| ServiceError::Remove {
        path: unit.path.clone(),
        source,
    })?;
    Ok(Done {
        said: format!("{}removed {}\n", done.said, unit.path.display()),
        failed: done.failed,
    })
}

fn run_all(commands: &[Vec<String>], mut said: String) -> Done {
    for (i, command) in commands.iter().enumerate() {
        match run(command) {
            None => said.push_str(&format!("ran: {}\n", command.join(" "))),
            Some(why) => {
                said.push_str(&format!("{why}\nrun by hand:\n"));
                for rest in &commands[i..] {
                    said.push_str(&format!("  {}\n", rest.join(" ")));
                }
                return Done { said, failed: true };
            }
        }
    }
    Done {
        said,
        failed: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env() -> Vec<(String, String)> {
        vec![
            ("PATH".into(), "/usr/bin:/home/ada/.cargo/bin".into()),
            ("AGENT_RELAY_HOME".into(), "/home/ada/relay 100%".into()),
        ]
    }

    #[test]
    fn the_systemd_unit_runs_serve_with_the_path_and_never_the_token() {
        let unit = unit(
            Manager::Systemd,
            Path::new("/home/ada/.cargo/bin/agent-relay"),
            Path::new("/home/ada"),
            Path::new("/home/ada/.config"),
            &env(),
        );
        assert_eq!(
            unit.path,
            Path::new("/home/ada/.config/systemd/user/agent-relay.service")
        );
        assert!(
            unit.text
                .contains("ExecStart=\"/home/ada/.cargo/bin/agent-relay\" serve\n"),
            "{}",
            unit.text
        );
        assert!(
            unit.text
                .contains("Environment=\"PATH=/usr/bin:/home/ada/.cargo/bin\"\n")
        );
        assert!(
            unit.text
                .contains("Environment=\"AGENT_RELAY_HOME=/home/ada/relay 100%%\"\n"),
            "a % is a systemd specifier: {}",
            unit.text
        );
        assert!(unit.text.contains("Restart=on-failure"));
        assert!(unit.text.contains("WantedBy=default.target"));
        assert!(!unit.text.contains("TELEGRAM_BOT_TOKEN="));
    }

    #[test]
    fn the_launchd_agent_is_written_but_loaded_only_on_macos() {
        let unit = unit(
            Manager::Launchd,
            Path::new("/Users/ada/bin/agent-relay"),
            Path::new("/Users/ada"),
            Path::new("/Users/ada/.config"),
            &env(),
        );
        assert_eq!(
            unit.path,
            Path::new("/Users/ada/Library/LaunchAgents/dev.agent-relay.serve.plist")
        );
        assert!(unit.text.contains("<string>dev.agent-relay.serve</string>"));
        assert!(
            unit.text.contains(
                "<string>/Users/ada/bin/agent-relay</string>\n    <string>serve</string>"
            )
        );
        assert!(
            unit.text
                .contains("<key>AGENT_RELAY_HOME</key>\n    <string>/home/ada/relay 100%</string>")
        );
        assert!(unit.text.contains("<key>KeepAlive</key>"));
        let loads = commands(&unit, true);
        if cfg!(target_os = "macos") {
            assert_eq!(loads[0][0], "launchctl");
        } else {
            assert!(loads.is_empty(), "never loaded where launchd is not");
        }
    }

    #[test]
    fn installing_writes_the_file_and_removing_takes_it_away() {
        let dir = tempfile::tempdir().unwrap();
        let mut unit = unit(
            Manager::Launchd,
            Path::new("/x/agent-relay"),
            dir.path(),
            dir.path(),
            &env(),
        );
        // Not this system's kind (on Linux): written, nothing run.
        unit.manager = if Manager::native() == Manager::Launchd {
            Manager::Systemd
        } else {
            Manager::Launchd
        };
        let shown = install(&unit, true).unwrap();
        assert!(shown.said.starts_with("would write"), "{}", shown.said);
        assert!(!unit.path.exists());
        let done = install(&unit, false).unwrap();
        assert!(!done.failed, "{}", done.said);
        assert_eq!(std::fs::read_to_string(&unit.path).unwrap(), unit.text);
        let removed = remove(&unit, false).unwrap();
        assert!(removed.said.contains("removed"), "{}", removed.said);
        assert!(!unit.path.exists());
    }
}
