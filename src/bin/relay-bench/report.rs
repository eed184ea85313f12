//! The table: each figure beside its same-run reference and its goal,
//! printed for people and written as JSON for comparison across runs.

use std::path::Path;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use crate::stats::{Summary, fmt_kib, fmt_ms, fmt_rate, ms};

/// One measured quantity, or why it could not be measured.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Measure {
    Latency(Summary),
    Rate {
        per_s: f64,
        count: u64,
        elapsed_ms: f64,
    },
    Memory {
        kib: u64,
    },
    /// Network traffic per unit of work (e.g. per inbound update).
    Traffic {
        messages: f64,
        bytes: f64,
    },
    /// What turns cost in Telegram's budget, per turn, and the longest
    /// wait from an agent's answer to its topic.
    Turns {
        sends: f64,
        edits: f64,
        too_many: u64,
        longest_wait_ms: f64,
    },
    NotAvailable {
        why: String,
    },
    /// The figure has no reference by design.
    None,
}

impl Measure {
    pub fn latency(samples: &[Duration], empty: &str) -> Measure {
        Summary::of(samples).map_or_else(|| Measure::na(empty), Measure::Latency)
    }

    pub fn rate(count: u64, elapsed: Duration) -> Measure {
        if count == 0 || elapsed.is_zero() {
            return Measure::na("nothing was delivered");
        }
        Measure::Rate {
            per_s: count as f64 / elapsed.as_secs_f64(),
            count,
            elapsed_ms: ms(elapsed),
        }
    }

    pub fn na(why: impl Into<String>) -> Measure {
        Measure::NotAvailable { why: why.into() }
    }

    /// A failed measurement is shown, not fatal: the table always prints.
    pub fn from_result(result: anyhow::Result<Measure>) -> Measure {
        result.unwrap_or_else(|e| Measure::na(format!("{e:#}")))
    }

    fn text(&self) -> String {
        match self {
            Measure::Latency(s) => format!(
                "min {} · med {} · p99 {} (n={})",
                fmt_ms(s.min_ms),
                fmt_ms(s.median_ms),
                fmt_ms(s.p99_ms),
                s.n
            ),
            Measure::Rate { per_s, count, .. } => format!("{} ({count} msgs)", fmt_rate(*per_s)),
            Measure::Memory { kib } => fmt_kib(*kib),
            Measure::Traffic { messages, bytes } => {
                format!("{messages:.1} messages · {bytes:.0} bytes")
            }
            Measure::Turns {
                sends,
                edits,
                too_many,
                longest_wait_ms,
            } => format!(
                "{sends:.1} sends · {edits:.1} edits a turn · {too_many} × 429 · longest wait {}",
                fmt_ms(*longest_wait_ms)
            ),
            Measure::NotAvailable { why } => format!("n/a: {why}"),
            Measure::None => "—".into(),
        }
    }
}

/// What a figure should reach.
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Goal {
    /// Growth rows: shown for the trend, judged by nothing.
    None,
    MedianAtMost {
        ms: f64,
    },
    PercentilesAtMost {
        p50_ms: f64,
        p99_ms: f64,
    },
    RateAtLeast {
        per_s: f64,
    },
    MemoryAtMost {
        kib: u64,
    },
    /// A median at most this many times the reference's (same run).
    MedianTimesReferenceAtMost {
        times: f64,
    },
}

impl Goal {
    fn text(self) -> String {
        match self {
            Goal::None => "—".into(),
            Goal::MedianAtMost { ms } => format!("median ≤ {}", fmt_ms(ms)),
            Goal::PercentilesAtMost { p50_ms, p99_ms } => {
                format!("p50 ≤ {}, p99 ≤ {}", fmt_ms(p50_ms), fmt_ms(p99_ms))
            }
            Goal::RateAtLeast { per_s } => format!("≥ {}", fmt_rate(per_s)),
            Goal::MemoryAtMost { kib } => format!("≤ {}", fmt_kib(kib)),
            Goal::MedianTimesReferenceAtMost { times } => {
                format!("median ≤ {times}× the reference")
            }
        }
    }

    /// `None` when there is nothing to judge (no goal, or no measurement).
    fn met_by(self, value: &Measure, reference: &Measure) -> Option<bool> {
        match (self, value) {
            (Goal::MedianTimesReferenceAtMost { times }, Measure::Latency(s)) => match reference {
                Measure::Latency(r) => Some(s.median_ms <= r.median_ms * times),
                _ => None,
            },
            (Goal::MedianAtMost { ms }, Measure::Latency(s)) => Some(s.median_ms <= ms),
            (Goal::PercentilesAtMost { p50_ms, p99_ms }, Measure::Latency(s)) => {
                Some(s.median_ms <= p50_ms && s.p99_ms <= p99_ms)
            }
            (Goal::RateAtLeast { per_s: goal }, Measure::Rate { per_s, .. }) => {
                Some(*per_s >= goal)
            }
            (Goal::MemoryAtMost { kib: goal }, Measure::Memory { kib }) => Some(*kib <= goal),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub figure: String,
    pub value: Measure,
    pub reference_name: String,
    pub reference: Measure,
    pub goal: Goal,
    pub met: Option<bool>,
    /// How it was measured, for the JSON reader.
    pub how: String,
}

impl Row {
    pub fn new(figure: impl Into<String>, how: impl Into<String>, value: Measure) -> Row {
        Row {
            figure: figure.into(),
            value,
            reference_name: String::new(),
            reference: Measure::None,
            goal: Goal::None,
            met: None,
            how: how.into(),
        }
    }

    pub fn reference(mut self, name: impl Into<String>, reference: Measure) -> Row {
        self.reference_name = name.into();
        self.reference = reference;
        self
    }

    pub fn goal(mut self, goal: Goal) -> Row {
        self.goal = goal;
        self.met = goal.met_by(&self.value, &self.reference);
        self
    }
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub relay_version: &'static str,
    pub started_unix_ms: u64,
    pub elapsed_s: f64,
    pub cpus: usize,
    pub quick: bool,
    pub rows: Vec<Row>,
}

impl Report {
    pub fn print(&self) {
        let header = ["figure", "result", "reference (same run)", "goal", ""];
        let cells: Vec<[String; 5]> = self
            .rows
            .iter()
            .map(|r| {
                let reference = match (&r.reference, r.reference_name.is_empty()) {
                    (Measure::None, _) | (_, true) => r.reference.text(),
                    (m, false) => format!("{}: {}", r.reference_name, m.text()),
                };
                let verdict = match r.met {
                    Some(true) => "ok",
                    Some(false) => "MISSED",
                    None => "",
                };
                [
                    r.figure.clone(),
                    r.value.text(),
                    reference,
                    r.goal.text(),
                    verdict.into(),
                ]
            })
            .collect();
        let mut widths = header.map(|h| h.chars().count());
        for row in &cells {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |row: &[String]| {
            let padded: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, w)| format!("{cell}{}", " ".repeat(w - cell.chars().count())))
                .collect();
            println!("| {} |", padded.join(" | "));
        };
        line(&header.map(String::from));
        let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
        println!("|-{}-|", rule.join("-|-"));
        for row in &cells {
            line(row);
        }
    }

    pub fn write_json(&self, dir: &Path) -> anyhow::Result<std::path::PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let path = dir.join("results.json");
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}
