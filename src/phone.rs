//! What a person writes to the relay from the phone that is not a prompt
//! for an agent: its commands ([`PhoneCommand`]), read once, where updates
//! are triaged (`leader::triage`), each with where it is answered
//! ([`Answerer`]) — by the leader itself (the control place, or about a
//! session in its topic) or by the session, which gets the command as its
//! canonical text through the journal, in order with the messages around
//! it. A draft's stop button is [`PhoneCommand::Stop`] too, and the
//! progress message's ⚡ Steer now ([`STEER_BUTTON`]) is a bare
//! [`PhoneCommand::Steer`].
//!
//! The arguments are read by whoever runs the command, with the readers
//! here: `/new`'s ([`new_args`]), `/every`'s ([`read_every`]) and `/at`'s
//! ([`read_at`]). Nothing here knows a socket, a store or Telegram.

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Local, NaiveDate, NaiveTime, TimeZone};

/// A command from the phone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PhoneCommand {
    /// `/start [code]` in the bot's private chat: pairing.
    Start(String),
    /// `/new …`: its arguments as written ([`new_args`] reads them).
    New(String),
    Sessions,
    /// `/resume [slot or name]`.
    Resume(Option<String>),
    End,
    Model,
    /// `/every <interval or cron> …` (the rest as written).
    Every(String),
    /// `/at <time> …`.
    At(String),
    Schedules,
    /// `/status` in a session's topic: the session's status line.
    Status,
    /// `/stop` (or a draft's stop button): the running turn stops.
    Stop,
    /// `/resend`: what did not reach the topic goes again.
    Resend,
    /// `/steer [text]` (or the ⚡ Steer now button, without text): the text,
    /// or else what waits for the next turn, goes into the running turn.
    Steer(String),
}

/// The `callback_data` of the progress message's ⚡ Steer now button.
pub const STEER_BUTTON: &str = "steer";

/// Who answers a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answerer {
    /// The leader: pairing, the control place, a launched session's life.
    Leader,
    /// The session whose topic it was written in.
    Session,
}

impl PhoneCommand {
    /// Reads a command: a slash, a known name (with `@bot` as groups send
    /// it), and what follows. `None`: not a command, a prompt.
    pub fn parse(text: &str) -> Option<Self> {
        let text = text.trim();
        let word = text.strip_prefix('/')?;
        let (name, rest) = word.split_once(char::is_whitespace).unwrap_or((word, ""));
        let name = name.split('@').next()?;
        let rest = rest.trim();
        let args = || rest.to_string();
        Some(match name {
            "start" => Self::Start(args()),
            "new" => Self::New(args()),
            "sessions" => Self::Sessions,
            "resume" => Self::Resume((!rest.is_empty()).then(args)),
            "end" => Self::End,
            "model" => Self::Model,
            "every" => Self::Every(args()),
            "at" => Self::At(args()),
            "schedules" => Self::Schedules,
            "status" => Self::Status,
            "stop" => Self::Stop,
            "resend" => Self::Resend,
            "steer" => Self::Steer(args()),
            _ => return None,
        })
    }

    /// Who answers it.
    pub fn answerer(&self) -> Answerer {
        match self {
            Self::Status | Self::Stop | Self::Resend | Self::Steer(_) => Answerer::Session,
            _ => Answerer::Leader,
        }
    }

    /// How a session's command travels to it through the journal: its
    /// canonical text (`None` for the leader's commands).
    pub fn journaled(&self) -> Option<String> {
        match self {
            Self::Status => Some("/status".into()),
            Self::Stop => Some("/stop".into()),
            Self::Resend => Some("/resend".into()),
            Self::Steer(text) if text.is_empty() => Some("/steer".into()),
            Self::Steer(text) => Some(format!("/steer {text}")),
            _ => None,
        }
    }

    /// A delivered message that is a session's command, read back from
    /// the text the journal carries.
    pub fn delivered(text: &str) -> Option<Self> {
        Self::parse(text).filter(|c| c.answerer() == Answerer::Session)
    }
}

/// What `/new` names: `[machine:]<folder> [engine] [first prompt…]`, all
/// optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewArgs {
    pub machine: Option<String>,
    pub folder: Option<String>,
    pub engine: Option<String>,
    pub prompt: Option<String>,
}

/// The next word of `text` (double quotes keep spaces in a folder), and
/// what follows it.
pub fn next_word(text: &str) -> Option<(String, &str)> {
    let text = text.trim_start();
    if text.is_empty() {
        return None;
    }
    if let Some(quoted) = text.strip_prefix('"')
        && let Some(end) = quoted.find('"')
    {
        return Some((quoted[..end].to_string(), &quoted[end + 1..]));
    }
    let end = text.find(char::is_whitespace).unwrap_or(text.len());
    Some((text[..end].to_string(), &text[end..]))
}

/// `[machine:]<folder> [engine] [prompt…]`, or `<engine> [folder] [prompt…]`.
///
/// An engine's name first is always the engine, never a folder of that
/// name: a person who writes `/new claude` means Claude Code, and an agent
/// started in `~/code/claude` because of it would be a surprise. After an
/// engine, only a word written as a path (`~/…`, `/…`, `./…`, `box:~/…`) is
/// the folder; anything else is the first prompt, and the folders are
/// offered. A folder named like an engine is written as a path: `./claude`.
pub fn new_args(rest: &str, engines: &[String]) -> NewArgs {
    let Some((first, after)) = next_word(rest) else {
        return NewArgs::default();
    };
    if engines.contains(&first) {
        let mut args = NewArgs {
            engine: Some(first),
            ..NewArgs::default()
        };
        let mut rest = after;
        if let Some((word, after)) = next_word(rest)
            && let (machine, folder) = split_machine(&word)
            && is_path(&folder)
        {
            args.machine = machine;
            args.folder = Some(folder);
            rest = after;
        }
        let prompt = rest.trim();
        args.prompt = (!prompt.is_empty()).then(|| prompt.to_string());
        return args;
    }
    let (machine, folder) = split_machine(&first);
    let mut args = NewArgs {
        machine,
        folder: Some(folder),
        ..NewArgs::default()
    };
    let mut rest = after;
    if let Some((word, after)) = next_word(rest)
        && engines.contains(&word)
    {
        args.engine = Some(word);
        rest = after;
    }
    let prompt = rest.trim();
    args.prompt = (!prompt.is_empty()).then(|| prompt.to_string());
    args
}

/// Whether a word is written as a path: from home, the root or here.
fn is_path(word: &str) -> bool {
    word.starts_with('~') || word.starts_with('/') || word.starts_with('.')
}

/// `laptop:~/api` → the machine and the folder; a folder alone stays one.
fn split_machine(place: &str) -> (Option<String>, String) {
    if let Some((machine, folder)) = place.split_once(':')
        && (1..=32).contains(&machine.len())
        && machine
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && is_path(folder)
    {
        return (Some(machine.to_string()), folder.to_string());
    }
    (None, place.to_string())
}

/// The shortest interval `/every` takes…
pub const SHORTEST: Duration = Duration::from_secs(5);
/// …and the longest; nor does `/at` reach further ahead. Beyond a year a
/// schedule is a typo, and its milliseconds must fit the store's integers.
pub const LONGEST: Duration = Duration::from_secs(366 * 24 * 3600);

/// When a schedule fires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum When {
    Every(Duration),
    /// Five cron fields (or a nickname such as `@daily`).
    Cron(String),
    /// Once, at this Unix millisecond.
    At(i64),
}

/// Reads `/every`'s `<interval or cron>`; answers it and what follows.
pub fn read_every(rest: &str) -> Result<(When, &str), String> {
    let Some((first, after)) = next_word(rest) else {
        return Err("say how often: /every 30m <prompt>, or /every 0 9 * * 1-5 <prompt>".into());
    };
    // A bare number is a cron field (`0 9 * * *`), never an interval.
    let interval = first.bytes().any(|b| b.is_ascii_alphabetic());
    if let Some(every) = interval
        .then(|| humantime::parse_duration(&first).ok())
        .flatten()
    {
        if every < SHORTEST {
            return Err(format!("at most once every {} s", SHORTEST.as_secs()));
        }
        if every > LONGEST {
            return Err(format!(
                "{first} is longer than a year: /every takes at most 366d"
            ));
        }
        return Ok((When::Every(every), after));
    }
    if first.starts_with('@') {
        croner::Cron::from_str(&first).map_err(|e| format!("{first}: {e}"))?;
        return Ok((When::Cron(first), after));
    }
    let mut fields = vec![first];
    let mut rest = after;
    while fields.len() < 5 {
        let Some((word, after)) = next_word(rest) else {
            break;
        };
        fields.push(word);
        rest = after;
    }
    let pattern = fields.join(" ");
    croner::Cron::from_str(&pattern).map_err(|e| {
        format!("“{pattern}” is neither an interval (30m, 2h, 1d) nor five cron fields: {e}")
    })?;
    Ok((When::Cron(pattern), rest))
}

/// Reads `/at`'s `<time>`: `+30m` or `in 30m`, `14:30` (the next one), or
/// `2026-07-01 09:00`; answers the Unix millisecond and what follows.
pub fn read_at(rest: &str, now: DateTime<Local>) -> Result<(i64, &str), String> {
    let usage = "say when: /at 14:30 <prompt>, /at +2h <prompt> or /at 2026-07-01 09:00 <prompt>";
    let Some((first, after)) = next_word(rest) else {
        return Err(usage.into());
    };
    let relative = match first.as_str() {
        "in" => next_word(after),
        word => word.strip_prefix('+').map(|d| (d.to_string(), after)),
    };
    if let Some((span, after)) = relative {
        let parsed = humantime::parse_duration(&span).map_err(|e| format!("{span}: {e}"))?;
        let at = (parsed <= LONGEST)
            .then(|| chrono::Duration::from_std(parsed).ok())
            .flatten()
            .and_then(|span| now.checked_add_signed(span))
            .ok_or_else(|| format!("{span} is more than a year ahead: /at reaches 366d at most"))?;
        return Ok((at.timestamp_millis(), after));
    }
    if let Ok(time) = NaiveTime::parse_from_str(&first, "%H:%M") {
        let today = now.date_naive().and_time(time);
        let mut at = local(today).ok_or("that time does not exist today here")?;
        if at <= now {
            at = local(today + chrono::Duration::days(1)).ok_or("that time does not exist here")?;
        }
        return Ok((at.timestamp_millis(), after));
    }
    if let Ok(date) = NaiveDate::parse_from_str(&first, "%Y-%m-%d") {
        let (time, after) = next_word(after).ok_or(usage)?;
        let time = NaiveTime::parse_from_str(&time, "%H:%M").map_err(|_| usage.to_string())?;
        let at = local(date.and_time(time)).ok_or("that time does not exist here")?;
        if at <= now {
            return Err(format!("{} has passed", at.format("%Y-%m-%d %H:%M")));
        }
        if (at - now).to_std().map_or(true, |ahead| ahead > LONGEST) {
            return Err(format!(
                "{} is more than a year ahead: /at reaches 366 days at most",
                at.format("%Y-%m-%d %H:%M")
            ));
        }
        return Ok((at.timestamp_millis(), after));
    }
    Err(usage.into())
}

fn local(naive: chrono::NaiveDateTime) -> Option<DateTime<Local>> {
    Local.from_local_datetime(&naive).earliest()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engines() -> Vec<String> {
        vec!["pi".into(), "claude".into()]
    }

    fn new(text: &str, engines: &[String]) -> Option<NewArgs> {
        match PhoneCommand::parse(text)? {
            PhoneCommand::New(rest) => Some(new_args(&rest, engines)),
            _ => None,
        }
    }

    #[test]
    fn a_sessions_commands_are_recognised_with_or_without_the_bot_name() {
        let delivered = PhoneCommand::delivered;
        assert_eq!(delivered("/stop"), Some(PhoneCommand::Stop));
        assert_eq!(delivered(" /status@relay_bot "), Some(PhoneCommand::Status));
        assert_eq!(delivered("/resend"), Some(PhoneCommand::Resend));
        assert_eq!(delivered("/stopper"), None);
        assert_eq!(
            delivered("/steer@relay_bot  look at the tests too "),
            Some(PhoneCommand::Steer("look at the tests too".into()))
        );
        assert_eq!(
            delivered("/steer"),
            Some(PhoneCommand::Steer(String::new()))
        );
        for steer in ["/steer", "/steer not that file\nthe other"] {
            let command = PhoneCommand::parse(steer).unwrap();
            assert_eq!(
                PhoneCommand::delivered(&command.journaled().unwrap()),
                Some(command),
                "the journal carries it whole"
            );
        }
        assert_eq!(delivered("please /stop"), None);
        assert_eq!(delivered("/start abc"), None, "the leader's");
    }

    #[test]
    fn commands_are_read_with_their_arguments() {
        assert_eq!(
            new("/new ~/api claude fix the build", &engines()),
            Some(NewArgs {
                machine: None,
                folder: Some("~/api".into()),
                engine: Some("claude".into()),
                prompt: Some("fix the build".into()),
            })
        );
        assert_eq!(
            new("/new@relay_bot box:/srv/web", &engines()),
            Some(NewArgs {
                machine: Some("box".into()),
                folder: Some("/srv/web".into()),
                ..NewArgs::default()
            })
        );
        assert_eq!(
            new("/new \"~/my project\" pi go on", &engines()),
            Some(NewArgs {
                folder: Some("~/my project".into()),
                engine: Some("pi".into()),
                prompt: Some("go on".into()),
                ..NewArgs::default()
            })
        );
        assert_eq!(
            new("/new ~/api pilot the change", &engines()),
            Some(NewArgs {
                folder: Some("~/api".into()),
                prompt: Some("pilot the change".into()),
                ..NewArgs::default()
            }),
            "an engine is a whole word"
        );
        assert_eq!(new("/new", &engines()), Some(NewArgs::default()));
        assert_eq!(
            PhoneCommand::parse("/resume B"),
            Some(PhoneCommand::Resume(Some("B".into())))
        );
        assert_eq!(
            PhoneCommand::parse("/every 1h run it"),
            Some(PhoneCommand::Every("1h run it".into()))
        );
        assert_eq!(PhoneCommand::parse("hello /new"), None);
        assert_eq!(PhoneCommand::parse("/frobnicate"), None);
        assert_eq!(
            PhoneCommand::parse("/model").map(|c| c.answerer()),
            Some(Answerer::Leader)
        );
        assert_eq!(
            PhoneCommand::parse(" /stop@relay_bot ").map(|c| c.answerer()),
            Some(Answerer::Session),
            "the session's own, as groups send it"
        );
        assert_eq!(
            PhoneCommand::delivered("/status@relay_bot"),
            Some(PhoneCommand::Status)
        );
        assert_eq!(PhoneCommand::delivered("/end"), None, "the leader's");
        assert_eq!(PhoneCommand::Stop.journaled().as_deref(), Some("/stop"));
    }

    #[test]
    fn an_engine_named_first_is_the_engine_never_a_folder() {
        let with = |text: &str| new(text, &engines());
        assert_eq!(
            with("/new claude"),
            Some(NewArgs {
                engine: Some("claude".into()),
                ..NewArgs::default()
            }),
            "the folders are offered for Claude Code"
        );
        assert_eq!(
            with("/new pi fix the build"),
            Some(NewArgs {
                engine: Some("pi".into()),
                prompt: Some("fix the build".into()),
                ..NewArgs::default()
            }),
            "a word that is no path is the first prompt"
        );
        assert_eq!(
            with("/new claude ~/api fix it"),
            Some(NewArgs {
                folder: Some("~/api".into()),
                engine: Some("claude".into()),
                prompt: Some("fix it".into()),
                ..NewArgs::default()
            })
        );
        assert_eq!(
            with("/new claude box:/srv/web"),
            Some(NewArgs {
                machine: Some("box".into()),
                folder: Some("/srv/web".into()),
                engine: Some("claude".into()),
                ..NewArgs::default()
            })
        );
        assert_eq!(
            with("/new ./claude pi"),
            Some(NewArgs {
                folder: Some("./claude".into()),
                engine: Some("pi".into()),
                ..NewArgs::default()
            }),
            "a folder named like an engine, written as a path"
        );
        // Any engine the leader is told of, not a list of the parser's own.
        assert_eq!(
            new("/new codex", &["codex".to_string()]),
            Some(NewArgs {
                engine: Some("codex".into()),
                ..NewArgs::default()
            })
        );
        assert_eq!(
            new("/new codex", &engines()),
            Some(NewArgs {
                folder: Some("codex".into()),
                ..NewArgs::default()
            }),
            "a word no engine has is a folder"
        );
    }

    #[test]
    fn a_machine_is_named_only_before_a_folder() {
        assert_eq!(
            split_machine("laptop:~/api"),
            (Some("laptop".into()), "~/api".into())
        );
        assert_eq!(split_machine("~/a:b"), (None, "~/a:b".into()));
        assert_eq!(split_machine("Box:/x"), (None, "Box:/x".into()));
    }
    fn at(text: &str) -> DateTime<Local> {
        local(chrono::NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M").unwrap()).unwrap()
    }

    #[test]
    fn intervals_and_cron_patterns_are_read_with_what_follows() {
        let (when, rest) = read_every("90m check the queue").unwrap();
        assert_eq!(when, When::Every(Duration::from_secs(5400)));
        assert_eq!(rest.trim(), "check the queue");
        let (when, rest) = read_every("0 9 * * 1-5 standup notes").unwrap();
        assert_eq!(when, When::Cron("0 9 * * 1-5".into()));
        assert_eq!(rest.trim(), "standup notes");
        let (when, _) = read_every("@daily x").unwrap();
        assert_eq!(when, When::Cron("@daily".into()));
        assert!(
            read_every("1s spin")
                .unwrap_err()
                .contains("at most once every")
        );
        assert!(read_every("often please").is_err());
        assert!(
            read_every("2305843009213693952s boom")
                .unwrap_err()
                .contains("longer than a year"),
            "an interval too long for the store's milliseconds is refused"
        );
        assert!(read_every("367d x").is_err());
        assert_eq!(
            read_every("366d x").unwrap().0,
            When::Every(Duration::from_secs(366 * 24 * 3600))
        );
    }

    #[test]
    fn a_time_of_day_is_the_next_one_and_a_date_must_come() {
        let now = at("2026-03-10 15:00");
        let (ms, rest) = read_at("14:30 review", now).unwrap();
        assert_eq!(
            ms,
            at("2026-03-11 14:30").timestamp_millis(),
            "passed today: tomorrow"
        );
        assert_eq!(rest.trim(), "review");
        let (ms, _) = read_at("16:00 x", now).unwrap();
        assert_eq!(ms, at("2026-03-10 16:00").timestamp_millis());
        let (ms, _) = read_at("+2h x", now).unwrap();
        assert_eq!(ms, at("2026-03-10 17:00").timestamp_millis());
        let (ms, _) = read_at("in 30m x", now).unwrap();
        assert_eq!(ms, at("2026-03-10 15:30").timestamp_millis());
        let (ms, _) = read_at("2026-04-01 09:00 x", now).unwrap();
        assert_eq!(ms, at("2026-04-01 09:00").timestamp_millis());
        assert!(
            read_at("2026-01-01 09:00 x", now)
                .unwrap_err()
                .contains("passed")
        );
        assert!(read_at("soon x", now).is_err());
        for far in [
            "+200000000y x",
            "in 400d x",
            "9999-12-31 23:59 x",
            "+99999999999999999999s x",
        ] {
            assert!(read_at(far, now).is_err(), "{far}");
        }
    }
}
