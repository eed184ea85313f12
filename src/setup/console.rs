//! The terminal setup talks to: lines out (every one through [`redact`]),
//! answers in, the token read without echo, and the pairing link as a QR
//! code.
//!
//! Hidden input is a few lines of termios rather than a crate: echo, line
//! editing and signals are switched off while the token is typed, so that
//! Ctrl-C arrives as a byte and ends setup *after* the terminal has been
//! put back (a SIGINT in the middle would leave the user's shell without
//! echo). Everything else reads cooked lines from stdin.

use std::io::{self, BufRead, IsTerminal, Read, Write};

use qrcode::QrCode;
use qrcode::render::unicode::Dense1x2;

use crate::redact::redact;
use crate::sys::TerminalMode;

/// The user ended setup (Ctrl-C at a hidden prompt, or end of input).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aborted;

/// stdin and stdout of a person at a terminal.
pub struct Console {
    _private: (),
}

impl Console {
    /// The console, if both stdin and stdout are terminals.
    pub fn open() -> Option<Self> {
        (io::stdin().is_terminal() && io::stdout().is_terminal()).then_some(Self { _private: () })
    }

    /// One line out, redacted.
    pub fn say(&self, text: &str) {
        let mut out = io::stdout().lock();
        let _ = writeln!(out, "{}", redact(text));
        let _ = out.flush();
    }

    /// Asks `prompt` and returns the answer, trimmed.
    pub fn ask(&self, prompt: &str) -> Result<String, Aborted> {
        self.prompt(prompt);
        let mut line = String::new();
        match io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => Err(Aborted),
            Ok(_) => Ok(line.trim().to_string()),
        }
    }

    /// A yes/no question; an empty answer is `default`.
    pub fn confirm(&self, prompt: &str, default: bool) -> Result<bool, Aborted> {
        let hint = if default { "[Y/n]" } else { "[y/N]" };
        loop {
            let answer = self.ask(&format!("{prompt} {hint} "))?.to_ascii_lowercase();
            match answer.as_str() {
                "" => return Ok(default),
                "y" | "yes" => return Ok(true),
                "n" | "no" => return Ok(false),
                _ => self.say("Please answer y or n."),
            }
        }
    }

    /// Reads a secret without echoing it. Printable ASCII is kept (a token
    /// has nothing else); backspace and Ctrl-U edit; Ctrl-C, or Ctrl-D on
    /// an empty line, abort.
    pub fn ask_secret(&self, prompt: &str) -> Result<String, Aborted> {
        self.prompt(prompt);
        let guard = RawInput::enter();
        let mut secret = String::new();
        let mut stdin = io::stdin().lock();
        let mut byte = [0u8; 1];
        let outcome = loop {
            match stdin.read(&mut byte) {
                Ok(0) | Err(_) => break Err(Aborted),
                Ok(_) => {}
            }
            match byte[0] {
                b'\r' | b'\n' => break Ok(()),
                0x03 => break Err(Aborted),
                0x04 if secret.is_empty() => break Err(Aborted),
                0x7f | 0x08 => {
                    secret.pop();
                }
                0x15 => secret.clear(),
                b @ 0x20..=0x7e => secret.push(char::from(b)),
                _ => {}
            }
        };
        drop(guard);
        // The Enter was not echoed.
        println!();
        outcome.map(|()| secret.trim().to_string())
    }

    fn prompt(&self, prompt: &str) {
        let mut out = io::stdout().lock();
        let _ = write!(out, "{}", redact(prompt));
        let _ = out.flush();
    }
}

/// stdin without echo, line editing or signals, until dropped. Where
/// stdin is no terminal (tests feeding a pipe) nothing changes.
struct RawInput {
    saved: Option<TerminalMode>,
}

impl RawInput {
    fn enter() -> Self {
        let saved = TerminalMode::save();
        if let Some(saved) = saved {
            saved.raw().apply();
        }
        Self { saved }
    }
}

impl Drop for RawInput {
    fn drop(&mut self) {
        if let Some(saved) = &self.saved {
            saved.apply();
        }
    }
}

/// `text` as a QR code of half-height block characters, light modules
/// drawn (so it reads on the usual dark terminal background), with the
/// standard quiet zone. `None` if it does not fit a QR code.
pub fn qr_code(text: &str) -> Option<String> {
    let code = QrCode::new(text.as_bytes()).ok()?;
    Some(
        code.render::<Dense1x2>()
            .dark_color(Dense1x2::Light)
            .light_color(Dense1x2::Dark)
            .quiet_zone(true)
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pairing_link_fits_a_small_qr_code() {
        let link = "https://t.me/relay_test_bot?start=0123456789abcdef0123456789abcdef";
        let code = qr_code(link).expect("a QR code");
        let lines: Vec<&str> = code.lines().collect();
        let width = lines[0].chars().count();
        assert!(lines.iter().all(|l| l.chars().count() == width));
        // Version 4 (33 modules) plus a quiet zone of 4 on each side.
        assert!(width <= 45, "{width} columns");
        assert!(lines.len() <= 23, "{} lines", lines.len());
        assert!(
            code.chars().all(|c| " ▀▄█\n".contains(c)),
            "only block characters"
        );
        // The quiet zone is drawn: the first line is all full blocks.
        assert!(lines[0].chars().all(|c| c == '█'), "{}", lines[0]);
    }
}
