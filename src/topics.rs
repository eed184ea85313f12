//! Slots A–Z, topic names and the decisions around them. Pure functions: the
//! leader feeds them its registry and store, so the rules are testable alone.

use crate::ids::Slot;

/// Telegram's limit on a topic name, in characters.
const MAX_TOPIC_NAME: usize = 128;

/// The topic's name: slot letter and session, e.g. `A · api-server`; with
/// the machine's name when the relay spans machines, `A · laptop · api-server`.
pub fn topic_name(slot: Slot, node: Option<&str>, session_name: &str) -> String {
    let session: String = session_name
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let session = session.trim();
    let session = if session.is_empty() {
        "session"
    } else {
        session
    };
    let name = match node {
        Some(node) => format!("{slot} · {node} · {session}"),
        None => format!("{slot} · {session}"),
    };
    name.chars().take(MAX_TOPIC_NAME).collect()
}

/// The session part of a topic name (`api-server` of `A · api-server`).
pub fn session_part(topic_name: &str) -> &str {
    topic_name
        .split_once(" · ")
        .map_or(topic_name, |(_, session)| session)
}

/// The key a registering session's binding is stored under.
///
/// Two live sessions never share a topic: a session keeps the key it carried
/// from an earlier registration when that key is still its own; otherwise it
/// gets the key it asked for, or, when a live session already owns that one,
/// the first free `key#n`.
pub fn effective_profile_key(
    requested: &str,
    carried: Option<&str>,
    is_live: impl Fn(&str) -> bool,
) -> String {
    if let Some(carried) = carried
        && derives_from(carried, requested)
        && !is_live(carried)
    {
        return carried.to_string();
    }
    if !is_live(requested) {
        return requested.to_string();
    }
    (2..)
        .map(|n| format!("{requested}#{n}"))
        .find(|key| !is_live(key))
        .expect("there are fewer live sessions than integers")
}

fn derives_from(key: &str, base: &str) -> bool {
    key == base
        || key
            .strip_prefix(base)
            .and_then(|rest| rest.strip_prefix('#'))
            .is_some_and(|n| n.parse::<u32>().is_ok())
}

/// A slot another session's stored binding holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HeldSlot {
    pub slot: Slot,
    /// The binding was disconnected: its topic is gone, the slot is cheap.
    pub offline: bool,
    /// When the binding was last written (unix ms).
    pub updated_ms: u64,
}

/// Picks a slot for a registering session.
///
/// `preferred` (the slot it had) wins when no live session holds it. Else the
/// first slot that neither a live session nor a stored binding holds; else a
/// slot reclaimed from a stored binding that is not live — a disconnected one
/// first, then the least recently used. `None` when 26 live sessions hold
/// every slot.
pub fn allocate_slot(preferred: Option<Slot>, live: &[Slot], held: &[HeldSlot]) -> Option<Slot> {
    if let Some(slot) = preferred
        && !live.contains(&slot)
    {
        return Some(slot);
    }
    let mut all = (0..Slot::ALL).filter_map(Slot::from_index);
    if let Some(slot) = all
        .clone()
        .find(|s| !live.contains(s) && !held.iter().any(|h| h.slot == *s))
    {
        return Some(slot);
    }
    held.iter()
        .filter(|h| !live.contains(&h.slot))
        .min_by_key(|h| (!h.offline, h.updated_ms))
        .map(|h| h.slot)
        .or_else(|| all.find(|s| !live.contains(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(c: char) -> Slot {
        Slot::from_index(c as usize - 'A' as usize).unwrap()
    }

    #[test]
    fn names_show_slot_and_session() {
        assert_eq!(topic_name(slot('A'), None, "api-server"), "A · api-server");
        assert_eq!(topic_name(slot('B'), None, "  \n "), "B · session");
        assert_eq!(
            topic_name(slot('C'), None, &"x".repeat(300))
                .chars()
                .count(),
            128
        );
        assert_eq!(
            topic_name(slot('D'), Some("laptop"), "api"),
            "D · laptop · api"
        );
        assert_eq!(session_part("A · web · 2"), "web · 2");
    }

    #[test]
    fn newcomer_with_a_live_key_gets_its_own() {
        let live = ["k", "k#2"];
        let is_live = |key: &str| live.contains(&key);
        assert_eq!(effective_profile_key("k", None, is_live), "k#3");
        assert_eq!(effective_profile_key("other", None, is_live), "other");
        // A session that carries its old key keeps it when it is free…
        assert_eq!(effective_profile_key("k", Some("k#5"), is_live), "k#5");
        // …but never takes one that belongs to another base key.
        assert_eq!(effective_profile_key("j", Some("k#5"), is_live), "j");
        assert_eq!(effective_profile_key("k", Some("k#x"), is_live), "k#3");
    }

    fn held(c: char, offline: bool, updated_ms: u64) -> HeldSlot {
        HeldSlot {
            slot: slot(c),
            offline,
            updated_ms,
        }
    }

    #[test]
    fn slots_prefer_the_old_one_then_free_ones() {
        assert_eq!(
            allocate_slot(Some(slot('C')), &[slot('A')], &[]),
            Some(slot('C'))
        );
        assert_eq!(
            allocate_slot(Some(slot('A')), &[slot('A')], &[]),
            Some(slot('B'))
        );
        // B belongs to a session that is away: keep it for its return.
        assert_eq!(
            allocate_slot(None, &[slot('A')], &[held('B', false, 5)]),
            Some(slot('C'))
        );
    }

    #[test]
    fn full_house_reclaims_disconnected_then_oldest_then_gives_up() {
        let live: Vec<Slot> = (0..23).filter_map(Slot::from_index).collect();
        let held_slots = [
            held('X', false, 20),
            held('Y', false, 10),
            held('Z', true, 30),
        ];
        assert_eq!(allocate_slot(None, &live, &held_slots), Some(slot('Z')));
        let all_active = [
            held('X', false, 20),
            held('Y', false, 10),
            held('Z', false, 30),
        ];
        assert_eq!(allocate_slot(None, &live, &all_active), Some(slot('Y')));
        let all: Vec<Slot> = (0..26).filter_map(Slot::from_index).collect();
        assert_eq!(allocate_slot(Some(slot('A')), &all, &[]), None);
    }
}
