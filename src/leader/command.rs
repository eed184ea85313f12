//! The commands the leader answers itself (docs/DESIGN.md, *Launching*),
//! read from what the user wrote: `/new`, `/sessions`, `/resume`, `/end`,
//! `/model`, `/every`, `/at`, `/schedules`. Reading them is apart from
//! answering them (`control.rs`) because the triage asks it first: a
//! message in a session's topic that is one of them is the leader's, not
//! a prompt for the agent.

/// A command the leader answers itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Command {
    /// `/new [machine:]<folder> [engine] [first prompt…]`, or `/new` alone.
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

/// `[machine:]<folder> [engine] [prompt…]`.
pub(super) fn new_args(rest: &str, engines: &[String]) -> NewArgs {
    let Some((place, rest)) = next_word(rest) else {
        return NewArgs::default();
    };
    let (machine, folder) = split_machine(&place);
    let mut args = NewArgs {
        machine,
        folder: Some(folder),
        ..NewArgs::default()
    };
    let mut rest = rest;
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

/// `laptop:~/api` → the machine and the folder; a folder alone stays one.
fn split_machine(place: &str) -> (Option<String>, String) {
    if let Some((machine, folder)) = place.split_once(':')
        && (1..=32).contains(&machine.len())
        && machine
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && (folder.starts_with('~') || folder.starts_with('/') || folder.starts_with('.'))
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
    fn a_machine_is_named_only_before_a_folder() {
        assert_eq!(
            split_machine("laptop:~/api"),
            (Some("laptop".into()), "~/api".into())
        );
        assert_eq!(split_machine("~/a:b"), (None, "~/a:b".into()));
        assert_eq!(split_machine("Box:/x"), (None, "Box:/x".into()));
    }
}
