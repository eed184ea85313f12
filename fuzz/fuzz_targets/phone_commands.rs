//! What a person types from the phone: arbitrary text read as a command
//! (`src/phone.rs`), and each command's arguments read as the relay reads
//! them (`/new`'s folder, engine and prompt; `/every`'s interval or cron;
//! `/at`'s time). Nothing may panic, and every number that is accepted is
//! within its range: an interval of 5 s to 366 days, a time at most 366
//! days ahead — what the leader's schedules can hold without overflowing.

#![no_main]

use agent_relay::phone::{LONGEST, PhoneCommand, SHORTEST, When, new_args, read_at, read_every};
use chrono::{Local, TimeZone};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let engines = ["pi".to_string(), "claude".to_string(), "codex".to_string()];
    // A fixed clock: the same input, the same path.
    let now = Local
        .timestamp_opt(1_800_000_000, 0)
        .single()
        .expect("a time that exists");
    for text in [text.to_string(), format!("/every {text}"), format!("/at {text}"), format!("/new {text}")] {
        match PhoneCommand::parse(&text) {
            Some(PhoneCommand::New(rest)) => {
                let args = new_args(&rest, &engines);
                if let Some(engine) = &args.engine {
                    assert!(engines.contains(engine), "{engine}");
                }
            }
            Some(PhoneCommand::Every(rest)) => {
                if let Ok((When::Every(every), _)) = read_every(&rest) {
                    assert!((SHORTEST..=LONGEST).contains(&every), "{every:?}");
                }
            }
            Some(PhoneCommand::At(rest)) => {
                if let Ok((at, _)) = read_at(&rest, now) {
                    let ahead = at - now.timestamp_millis();
                    assert!(ahead >= 0, "{at} is before now");
                    assert!(
                        ahead <= LONGEST.as_millis() as i64 + 26 * 3_600_000,
                        "{at} is too far ahead"
                    );
                }
            }
            _ => {}
        }
    }
});
