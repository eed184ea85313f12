//! The file rules both sides of the relay agree on: Telegram's size limits,
//! how a size reads to a person, file names made safe, and what counts as
//! a picture. Pure functions; the leader saves and sends files
//! (`leader::inbox`, `leader::files`, `leader::outbox`), the session
//! builds prompts from them.

/// The public Bot API downloads files up to 20 MB (`getFile`).
pub const DOWNLOAD_MAX: u64 = 20 * 1024 * 1024;
/// Uploads: documents up to 50 MB…
pub const UPLOAD_MAX: u64 = 50 * 1024 * 1024;
/// …photos up to 10 MB.
pub const PHOTO_UPLOAD_MAX: u64 = 10 * 1024 * 1024;

/// Longest file name the inbox keeps, in bytes (most file systems allow 255).
const NAME_MAX: usize = 120;

/// `182 KB`, `3.4 MB`, `900 bytes`: binary units, as Telegram's limits are.
pub fn describe_size(bytes: u64) -> String {
    const KB: u64 = 1024;
    const MB: u64 = 1024 * KB;
    if bytes >= MB {
        let tenths = (bytes * 10 + MB / 2) / MB;
        if tenths.is_multiple_of(10) {
            format!("{} MB", tenths / 10)
        } else {
            format!("{}.{} MB", tenths / 10, tenths % 10)
        }
    } else if bytes >= KB {
        format!("{} KB", (bytes + KB / 2) / KB)
    } else if bytes == 1 {
        "1 byte".into()
    } else {
        format!("{bytes} bytes")
    }
}

/// `size` and the `limit` it is measured against, as people read them and
/// told apart: where rounding would make both read the same (a file one
/// byte over 20 MB "is 20 MB"), both are given to the byte.
pub fn describe_against(size: u64, limit: u64) -> (String, String) {
    let (shown, limit_shown) = (describe_size(size), describe_size(limit));
    if shown != limit_shown || size == limit {
        return (shown, limit_shown);
    }
    (
        format!("{} bytes", grouped(size)),
        format!("{limit_shown} ({} bytes)", grouped(limit)),
    )
}

/// `20971521` as `20,971,521`.
fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// A name somebody else chose, made into one safe file name component: its
/// last path component only, letters, digits, `.`, `-`, `_` and spaces kept
/// (any other character becomes `_`), no leading dots (no hidden files, never
/// `.` or `..`), at most [`NAME_MAX`] bytes with the extension kept.
/// `None` when nothing is left.
pub fn safe_name(name: &str) -> Option<String> {
    let last = name.rsplit(['/', '\\']).next().unwrap_or_default();
    let mut out: String = last
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || matches!(c, '.' | '-' | '_' | ' ') {
                c
            } else {
                '_'
            }
        })
        .collect();
    out = out.trim_start_matches(['.', ' ']).trim_end().to_string();
    if out.len() > NAME_MAX {
        let extension = extension(&out).map(|e| format!(".{e}")).unwrap_or_default();
        let keep = NAME_MAX.saturating_sub(extension.len());
        let mut cut = keep;
        while !out.is_char_boundary(cut) {
            cut -= 1;
        }
        out = format!("{}{extension}", out[..cut].trim_end());
    }
    (!out.is_empty() && out.chars().any(|c| c != '.' && c != '_')).then_some(out)
}

/// The extension of a file name (without the dot), if it has a short one.
pub fn extension(name: &str) -> Option<&str> {
    let (stem, extension) = name.rsplit_once('.')?;
    (!stem.is_empty()
        && !extension.is_empty()
        && extension.len() <= 8
        && extension.chars().all(|c| c.is_ascii_alphanumeric()))
    .then_some(extension)
}

/// Whether the first bytes of a file are a picture Telegram shows as a
/// photo: JPEG, PNG, GIF, WebP or BMP.
pub fn is_picture(head: &[u8]) -> bool {
    head.starts_with(&[0xFF, 0xD8, 0xFF])
        || head.starts_with(b"\x89PNG\r\n\x1a\n")
        || head.starts_with(b"GIF8")
        || head.starts_with(b"BM")
        || (head.len() >= 12 && head.starts_with(b"RIFF") && &head[8..12] == b"WEBP")
}

/// `0:07`, `12:30`: a duration as a voice note shows it.
pub fn describe_duration(seconds: u32) -> String {
    format!("{}:{:02}", seconds / 60, seconds % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_say_them() {
        assert_eq!(describe_size(0), "0 bytes");
        assert_eq!(describe_size(1), "1 byte");
        assert_eq!(describe_size(900), "900 bytes");
        assert_eq!(describe_size(182 * 1024 + 10), "182 KB");
        assert_eq!(describe_size(DOWNLOAD_MAX), "20 MB");
        assert_eq!(describe_size(31_400_000), "29.9 MB");
        assert_eq!(describe_size(3 * 1024 * 1024 + 400 * 1024), "3.4 MB");
    }

    /// "20 MB + 1 byte is 20 MB" reads as no reason at all: at a limit,
    /// the sizes are exact.
    #[test]
    fn a_size_at_its_limit_is_told_to_the_byte() {
        assert_eq!(
            describe_against(DOWNLOAD_MAX + 1, DOWNLOAD_MAX),
            ("20,971,521 bytes".into(), "20 MB (20,971,520 bytes)".into())
        );
        assert_eq!(
            describe_against(28 * 1024 * 1024, DOWNLOAD_MAX),
            ("28 MB".into(), "20 MB".into())
        );
        assert_eq!(
            describe_against(UPLOAD_MAX + 1000, UPLOAD_MAX),
            ("52,429,800 bytes".into(), "50 MB (52,428,800 bytes)".into())
        );
    }

    #[test]
    fn names_lose_every_path_and_hidden_part() {
        for (given, safe) in [
            ("report.pdf", Some("report.pdf")),
            ("../../.bashrc", Some("bashrc")),
            ("..\\..\\win.ini", Some("win.ini")),
            ("/etc/passwd", Some("passwd")),
            ("..", None),
            ("...", None),
            ("", None),
            ("a/", None),
            ("Übersicht März.txt", Some("Übersicht März.txt")),
            ("x;rm -rf ~.sh", Some("x_rm -rf _.sh")),
            ("nul\0byte\n.txt", Some("nul_byte_.txt")),
            ("  .hidden  ", Some("hidden")),
        ] {
            assert_eq!(safe_name(given).as_deref(), safe, "{given:?}");
        }
        let long = format!("{}.tar", "é".repeat(200));
        let cut = safe_name(&long).unwrap();
        assert!(cut.len() <= NAME_MAX && cut.ends_with(".tar"), "{cut}");
    }

    #[test]
    fn pictures_are_known_by_their_first_bytes() {
        assert!(is_picture(b"\x89PNG\r\n\x1a\n...."));
        assert!(is_picture(&[0xFF, 0xD8, 0xFF, 0xE0]));
        assert!(is_picture(b"RIFF\0\0\0\0WEBPVP8 "));
        assert!(!is_picture(b"%PDF-1.7"));
        assert!(!is_picture(b""));
        assert_eq!(extension("a.tar.gz"), Some("gz"));
        assert_eq!(extension(".bashrc"), None);
        assert_eq!(describe_duration(7), "0:07");
        assert_eq!(describe_duration(750), "12:30");
    }
}
