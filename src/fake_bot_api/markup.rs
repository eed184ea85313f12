//! `reply_markup` as the Bot API server reads it (tdlib/telegram-bot-api's
//! `get_reply_markup`): a JSON object, or that object JSON-encoded in a string
//! (how form and multipart clients must send it). Error texts follow the server's,
//! with the first letter lowered as its answers do.

use serde_json::{Map, Value, json};

use super::error::ApiError;

/// Longest `callback_data`, in bytes.
const MAX_CALLBACK_DATA: usize = 64;

/// Button actions other than `url` and `callback_data`, kept as given, in the
/// order the server looks for them after those two.
const OTHER_ACTIONS: [&str; 9] = [
    "callback_game",
    "pay",
    "switch_inline_query",
    "switch_inline_query_current_chat",
    "switch_inline_query_chosen_chat",
    "login_url",
    "web_app",
    "copy_text",
    // Bot API 10.3: a button that does nothing when pressed.
    "disabled",
];

/// What the server knows of buttons: one that lags behind Telegram (a
/// self-hosted Bot API server, a proxy) knows no `disabled` button, and
/// takes one for a text button.
#[derive(Debug, Clone, Copy)]
pub(super) struct Server {
    pub disabled_buttons: bool,
}

#[cfg(test)]
impl Server {
    /// Telegram's own, as of Bot API 10.3.
    pub const CURRENT: Self = Self {
        disabled_buttons: true,
    };
}

/// The markup a send or edit carries, normalised as Telegram stores it; `None`
/// when absent. An inline keyboard without buttons is no markup, as on Telegram
/// (`{"inline_keyboard": []}` is how bots remove buttons).
pub(super) fn reply_markup(params: &Value, server: Server) -> Result<Option<Value>, ApiError> {
    let value = match params.get("reply_markup") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::String(s)) if s.is_empty() => return Ok(None),
        Some(Value::String(s)) => serde_json::from_str(s)
            .map_err(|_| ApiError::bad_request("can't parse reply keyboard markup JSON object"))?,
        Some(other) => other.clone(),
    };
    let Value::Object(object) = value else {
        return Err(ApiError::bad_request("object expected as reply markup"));
    };
    match object.get("inline_keyboard") {
        Some(keyboard) => inline_keyboard(keyboard, server),
        // Reply keyboards, `remove_keyboard` and `force_reply` never show in a
        // message object; the fake keeps them as given, for inspection.
        None if object.is_empty() => Ok(None),
        None => Ok(Some(Value::Object(object))),
    }
}

/// Edits take inline keyboards only.
pub(super) fn inline_markup_for_edit(
    params: &Value,
    server: Server,
) -> Result<Option<Value>, ApiError> {
    match reply_markup(params, server)? {
        Some(markup) if markup.get("inline_keyboard").is_none() => {
            Err(ApiError::bad_request("inline keyboard expected"))
        }
        markup => Ok(markup),
    }
}

fn inline_keyboard(keyboard: &Value, server: Server) -> Result<Option<Value>, ApiError> {
    let not_rows = || {
        ApiError::bad_request(
            "field \"inline_keyboard\" of the InlineKeyboardMarkup should be an Array of Arrays",
        )
    };
    let rows = keyboard.as_array().ok_or_else(not_rows)?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let buttons = row.as_array().ok_or_else(not_rows)?;
        let row = buttons
            .iter()
            .map(|b| button(b, server))
            .collect::<Result<Vec<_>, _>>()?;
        out.push(Value::Array(row));
    }
    if out.is_empty() {
        return Ok(None);
    }
    Ok(Some(json!({"inline_keyboard": out})))
}

/// One button: `text` and the first action found (`url` before `callback_data`,
/// so a button with both keeps the url).
fn button(button: &Value, server: Server) -> Result<Value, ApiError> {
    let bad =
        |why: &str| ApiError::bad_request(format!("can't parse inline keyboard button: {why}"));
    let Value::Object(fields) = button else {
        return Err(bad("InlineKeyboardButton should be an Object"));
    };
    let text = match fields.get("text") {
        None => return Err(bad("Can't find field \"text\"")),
        Some(Value::String(text)) => text.clone(),
        Some(_) => return Err(bad("Field \"text\" must be of type String")),
    };
    let string_field = |key: &str| match fields.get(key) {
        None | Some(Value::Null) => Ok(None),
        // The server treats an empty value as absent.
        Some(Value::String(s)) if s.is_empty() => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad(&format!("Field \"{key}\" must be of type String"))),
    };
    let mut out = Map::new();
    out.insert("text".to_owned(), json!(text));
    if let Some(url) = string_field("url")? {
        let scheme_ok = ["http://", "https://", "tg://"]
            .iter()
            .any(|scheme| url.to_ascii_lowercase().starts_with(scheme));
        if !scheme_ok {
            return Err(ApiError::bad_request(format!(
                "inline keyboard button URL '{url}' is invalid: Unsupported URL protocol"
            )));
        }
        out.insert("url".to_owned(), json!(url));
    } else if let Some(data) = string_field("callback_data")? {
        if data.len() > MAX_CALLBACK_DATA {
            return Err(ApiError::bad_request("BUTTON_DATA_INVALID"));
        }
        out.insert("callback_data".to_owned(), json!(data));
    } else if let Some((key, value)) = OTHER_ACTIONS
        .iter()
        .filter(|key| server.disabled_buttons || **key != "disabled")
        .find_map(|key| Some((*key, fields.get(*key).filter(|v| !v.is_null())?)))
    {
        out.insert(key.to_owned(), value.clone());
    } else {
        return Err(bad("Text buttons are unallowed in the inline keyboard"));
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(markup: Value) -> Result<Option<Value>, String> {
        reply_markup(&json!({ "reply_markup": markup }), Server::CURRENT).map_err(|e| e.description)
    }

    fn keyboard(button: Value) -> Value {
        json!({"inline_keyboard": [[button]]})
    }

    #[test]
    fn objects_and_json_strings_read_the_same() {
        let markup = keyboard(json!({"text": "Allow", "callback_data": "allow:1"}));
        assert_eq!(parse(markup.clone()), Ok(Some(markup.clone())));
        assert_eq!(parse(json!(markup.to_string())), Ok(Some(markup)));
        assert_eq!(parse(json!("")), Ok(None));
        assert_eq!(parse(Value::Null), Ok(None));
    }

    #[test]
    fn a_button_keeps_url_over_callback_data_and_drops_unknown_fields() {
        let both = keyboard(
            json!({"text": "Docs", "url": "https://example.org", "callback_data": "x", "extra": 1}),
        );
        assert_eq!(
            parse(both),
            Ok(Some(keyboard(
                json!({"text": "Docs", "url": "https://example.org"})
            )))
        );
    }

    #[test]
    fn callback_data_is_limited_to_64_bytes() {
        let data = |n: usize| keyboard(json!({"text": "t", "callback_data": "é".repeat(n)}));
        assert!(parse(data(32)).is_ok(), "64 bytes");
        assert_eq!(
            parse(data(33)),
            Err("Bad Request: BUTTON_DATA_INVALID".to_owned())
        );
    }

    #[test]
    fn malformed_markup_is_refused_with_the_servers_wording() {
        let refused = [
            (
                json!("{not json"),
                "can't parse reply keyboard markup JSON object",
            ),
            (json!("[1]"), "object expected as reply markup"),
            (
                json!({"inline_keyboard": [{"text": "x"}]}),
                "field \"inline_keyboard\" of the InlineKeyboardMarkup should be an Array of Arrays",
            ),
            (
                json!({"inline_keyboard": [["x"]]}),
                "can't parse inline keyboard button: InlineKeyboardButton should be an Object",
            ),
            (
                keyboard(json!({"callback_data": "x"})),
                "can't parse inline keyboard button: Can't find field \"text\"",
            ),
            (
                keyboard(json!({"text": "x"})),
                "can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard",
            ),
            (
                keyboard(json!({"text": "x", "callback_data": ""})),
                "can't parse inline keyboard button: Text buttons are unallowed in the inline keyboard",
            ),
            (
                keyboard(json!({"text": "x", "url": "ftp://example.org"})),
                "inline keyboard button URL 'ftp://example.org' is invalid: Unsupported URL protocol",
            ),
        ];
        for (markup, why) in refused {
            assert_eq!(
                parse(markup.clone()),
                Err(format!("Bad Request: {why}")),
                "{markup}"
            );
        }
    }

    #[test]
    fn an_empty_keyboard_is_no_markup_and_edits_want_inline_keyboards() {
        assert_eq!(parse(json!({"inline_keyboard": []})), Ok(None));
        let force = json!({"force_reply": true});
        assert_eq!(parse(force.clone()), Ok(Some(force.clone())));
        assert_eq!(
            inline_markup_for_edit(&json!({ "reply_markup": force }), Server::CURRENT)
                .map_err(|e| e.description),
            Err("Bad Request: inline keyboard expected".to_owned())
        );
    }
}
