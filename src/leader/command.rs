//! The commands the leader answers itself (docs/DESIGN.md, *Launching*),
//! read from what the user wrote: `/new`, `/sessions`, `/resume`, `/end`,
//! `/model`, `/every`, `/at`, `/schedules`. Reading them is apart from
//! answering them (`control.rs`) because the triage asks it first: a
//! message in a session's topic that is one of them is the leader's, not
//! a prompt for the agent.

/// A command the leader answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Command {
    /// `/new [machine:]<folder> [engine] [first prompt…]`, `/new` alone, or
    /// `/new <engine> [first prompt…]` (the folders offered).
    New(NewArgs),
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
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct NewArgs {
    pub machine: Option<String>,
    pub folder: Option<String>,
    pub engine: Option<String>,
    pub prompt: Option<String>,
}

/// Reads a command the leader answers itself; `engines` are the engine
/// names `/new` knows. `None`: not one of them.
pub(super) fn parse(text: &str, engines: &[String]) -> Option<Command> {
    let text = text.trim();
    let word = text.strip_prefix('/')?;
    let (name, rest) = word.split_once(char::is_whitespace).unwrap_or((word, ""));
    let name = name.split('@').next()?;
    let rest = rest.trim();
    Some(match name {
        "new" => Command::New(new_args(rest, engines)),
        "sessions" => Command::Sessions,
        "resume" => Command::Resume((!rest.is_empty()).then(|| rest.to_string())),
        "end" => Command::End,
        "model" => Command::Model,
        "every" => Command::Every(rest.to_string()),
        "at" => Command::At(rest.to_string()),
        "schedules" => Command::Schedules,
        _ => return None,
    })
}

/// Whether a message in a session's topic is the leader's to answer rather
/// than a prompt for the agent (the triage asks).
pub(super) fn is_topic_command(text: &str) -> bool {
    parse(text, &[]).is_some()
}

/// The next word of `text` (double quotes keep spaces in a folder), and
/// what follows it.
pub(super) fn next_word(text: &str) -> Option<(String, &str)> {
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
pub(super) fn new_args(rest: &str, engines: &[String]) -> NewArgs {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn engines() -> Vec<String> {
        vec!["pi".into(), "claude".into()]
    }

    #[test]
    fn commands_are_read_with_their_arguments() {
        assert_eq!(
            parse("/new ~/api claude fix the build", &engines()),
            Some(Command::New(NewArgs {
                machine: None,
                folder: Some("~/api".into()),
                engine: Some("claude".into()),
                prompt: Some("fix the build".into()),
            }))
        );
        assert_eq!(
            parse("/new@relay_bot box:/srv/web", &engines()),
            Some(Command::New(NewArgs {
                machine: Some("box".into()),
                folder: Some("/srv/web".into()),
                ..NewArgs::default()
            }))
        );
        assert_eq!(
            parse("/new \"~/my project\" pi go on", &engines()),
            Some(Command::New(NewArgs {
                folder: Some("~/my project".into()),
                engine: Some("pi".into()),
                prompt: Some("go on".into()),
                ..NewArgs::default()
            }))
        );
        assert_eq!(
            parse("/new ~/api pilot the change", &engines()),
            Some(Command::New(NewArgs {
                folder: Some("~/api".into()),
                prompt: Some("pilot the change".into()),
                ..NewArgs::default()
            })),
            "an engine is a whole word"
        );
        assert_eq!(
            parse("/new", &engines()),
            Some(Command::New(NewArgs::default()))
        );
        assert_eq!(
            parse("/resume B", &engines()),
            Some(Command::Resume(Some("B".into())))
        );
        assert_eq!(
            parse("/every 1h run it", &engines()),
            Some(Command::Every("1h run it".into()))
        );
        assert_eq!(parse("/status", &engines()), None, "the session's own");
        assert_eq!(parse("hello /new", &engines()), None);
        assert!(is_topic_command("/model"));
        assert!(!is_topic_command("/stop"));
    }

    #[test]
    fn an_engine_named_first_is_the_engine_never_a_folder() {
        let new = |text: &str| parse(text, &engines());
        assert_eq!(
            new("/new claude"),
            Some(Command::New(NewArgs {
                engine: Some("claude".into()),
                ..NewArgs::default()
            })),
            "the folders are offered for Claude Code"
        );
        assert_eq!(
            new("/new pi fix the build"),
            Some(Command::New(NewArgs {
                engine: Some("pi".into()),
                prompt: Some("fix the build".into()),
                ..NewArgs::default()
            })),
            "a word that is no path is the first prompt"
        );
        assert_eq!(
            new("/new claude ~/api fix it"),
            Some(Command::New(NewArgs {
                folder: Some("~/api".into()),
                engine: Some("claude".into()),
                prompt: Some("fix it".into()),
                ..NewArgs::default()
            }))
        );
        assert_eq!(
            new("/new claude box:/srv/web"),
            Some(Command::New(NewArgs {
                machine: Some("box".into()),
                folder: Some("/srv/web".into()),
                engine: Some("claude".into()),
                ..NewArgs::default()
            }))
        );
        assert_eq!(
            new("/new ./claude pi"),
            Some(Command::New(NewArgs {
                folder: Some("./claude".into()),
                engine: Some("pi".into()),
                ..NewArgs::default()
            })),
            "a folder named like an engine, written as a path"
        );
        // Any engine the leader is told of, not a list of the parser's own.
        assert_eq!(
            parse("/new codex", &["codex".to_string()]),
            Some(Command::New(NewArgs {
                engine: Some("codex".into()),
                ..NewArgs::default()
            }))
        );
        assert_eq!(
            parse("/new codex", &engines()),
            Some(Command::New(NewArgs {
                folder: Some("codex".into()),
                ..NewArgs::default()
            })),
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
}
