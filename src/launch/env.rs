//! The environment a launched agent gets (docs/DESIGN.md, *Launching*,
//! "The agent's environment"): `serve`'s own, less the relay's secrets.
//!
//! Removed: `TELEGRAM_BOT_TOKEN` and every `AGENT_RELAY_*` variable but
//! those in [`KEPT`], as the transcriber's environment does (issue 25):
//! the agent runs commands the model chooses, and its environment is
//! one `env` away from the model. Kept: the variables that say where the
//! relay's files are and which bot and chat it serves, none a secret,
//! because a pi agent's own sidecar (its extension spawns one) must find
//! the same bus and configuration as `serve` — it reads the token from
//! `config.toml`, never from its environment. (So with pi the token must
//! be in `config.toml`: `serve` says so when it is only in the
//! environment.) Added: [`LAUNCH_ENV`], the launch this agent is.

use std::ffi::{OsStr, OsString};

use crate::session::LAUNCH_ENV;

/// The relay's variables a launched agent keeps: where the files are, and
/// which bot, chat and users (no secret among them).
pub const KEPT: [&str; 7] = [
    "AGENT_RELAY_HOME",
    "AGENT_RELAY_BIN",
    "AGENT_RELAY_LOG",
    "AGENT_RELAY_API_URL",
    "AGENT_RELAY_CHAT_ID",
    "AGENT_RELAY_ALLOWED_USERS",
    "AGENT_RELAY_NODE_NAME",
];

/// The environment of launch `launch_id`'s agent, from `own` (`serve`'s).
pub fn agent_env(
    own: impl IntoIterator<Item = (OsString, OsString)>,
    launch_id: &str,
) -> Vec<(OsString, OsString)> {
    let mut env: Vec<(OsString, OsString)> = own.into_iter().filter(|(key, _)| kept(key)).collect();
    env.push((LAUNCH_ENV.into(), launch_id.into()));
    env
}

fn kept(key: &OsStr) -> bool {
    let Some(key) = key.to_str() else {
        return true;
    };
    if key == "TELEGRAM_BOT_TOKEN" || key == LAUNCH_ENV {
        return false;
    }
    !key.starts_with("AGENT_RELAY_") || KEPT.contains(&key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_gets_no_token_and_no_secret_but_finds_the_relay() {
        let own = [
            ("PATH", "/usr/bin"),
            ("HOME", "/home/ada"),
            (
                "TELEGRAM_BOT_TOKEN",
                "123456789:AAHdqTcvCH1vGWJxfSeofSAs0K5PALDsaw_",
            ),
            ("AGENT_RELAY_NATS_URL", "nats://relay:secret@h"),
            ("AGENT_RELAY_UNLIMITED", "1"),
            ("AGENT_RELAY_HOME", "/h"),
            ("AGENT_RELAY_API_URL", "http://127.0.0.1:9"),
            ("AGENT_RELAY_LAUNCH_ID", "forged"),
            ("ANTHROPIC_API_KEY", "the agent's own"),
        ]
        .map(|(k, v)| (OsString::from(k), OsString::from(v)));
        let env = agent_env(own, "0123456789ab");
        let keys: Vec<&str> = env.iter().filter_map(|(k, _)| k.to_str()).collect();
        assert_eq!(
            keys,
            [
                "PATH",
                "HOME",
                "AGENT_RELAY_HOME",
                "AGENT_RELAY_API_URL",
                "ANTHROPIC_API_KEY",
                LAUNCH_ENV
            ]
        );
        assert!(
            !env.iter()
                .any(|(_, v)| v.to_string_lossy().contains("secret")
                    || v.to_string_lossy().contains("AAHdq")),
            "{env:?}"
        );
        assert_eq!(env.last().unwrap().1, "0123456789ab");
    }
}
