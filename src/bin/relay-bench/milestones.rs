//! Where the time goes: the relay's milestones (`agent_relay::milestone`
//! debug events, `src/logging.rs`), read back from the logs of a world's
//! sidecars, each with the wall clock in microseconds. The sidecars of a
//! world with milestones on are started with [`ENV`]; the bench and the
//! sidecars share the machine's clock.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// What a sidecar is started with to log its milestones.
pub const ENV: (&str, &str) = ("AGENT_RELAY_LOG", "info,agent_relay::milestone=debug");

/// One milestone as logged.
#[derive(Debug, Clone)]
pub struct Milestone {
    pub step: String,
    pub id: i64,
    pub at_us: u128,
}

/// The wall clock now, in microseconds (as the relay logs it).
pub fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros())
}

/// A span between two wall-clock readings.
pub fn span(from_us: u128, to_us: u128) -> Duration {
    Duration::from_micros(u64::try_from(to_us.saturating_sub(from_us)).unwrap_or(u64::MAX))
}

/// Every milestone in the log files under `home`, oldest first. The logs
/// are written by a background thread of each sidecar: read them once the
/// work is over.
pub fn read(home: &Path) -> Vec<Milestone> {
    let mut found = Vec::new();
    let mut dirs = vec![home.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                found.extend(text.lines().filter_map(parse));
            }
        }
    }
    found.sort_by_key(|m| m.at_us);
    found
}

/// `… DEBUG agent_relay::milestone: step="lock" id=0 at_us=1764…`
fn parse(line: &str) -> Option<Milestone> {
    let (_, fields) = line.split_once("agent_relay::milestone: ")?;
    let mut fields: HashMap<&str, &str> = fields
        .split_whitespace()
        .filter_map(|f| f.split_once('='))
        .collect();
    Some(Milestone {
        step: fields.remove("step")?.trim_matches('"').to_string(),
        id: fields.remove("id")?.parse().ok()?,
        at_us: fields.remove("at_us")?.parse().ok()?,
    })
}

/// The first `step` at or after `from_us` and before `until_us`.
pub fn first_after<'a>(
    all: &'a [Milestone],
    step: &str,
    from_us: u128,
    until_us: u128,
) -> Option<&'a Milestone> {
    all.iter()
        .find(|m| m.step == step && m.at_us >= from_us && m.at_us < until_us)
}

/// The first `step` for update `id`.
pub fn of_update<'a>(all: &'a [Milestone], step: &str, id: i64) -> Option<&'a Milestone> {
    all.iter().find(|m| m.step == step && m.id == id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_milestone_as_the_relay_logs_it() {
        let line = r#"2026-12-03T14:14:21.123456Z DEBUG agent_relay::milestone: step="lock" id=0 at_us=1764771261123456"#;
        let m = parse(line).expect("a milestone");
        assert_eq!(
            (m.step.as_str(), m.id, m.at_us),
            ("lock", 0, 1764771261123456)
        );
        assert!(parse("2026-12-03T14:14:21Z INFO agent_relay: leading the bus").is_none());
    }
}
