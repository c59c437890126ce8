//! gpud's diagnostics: one line each on stderr, with its level in front as
//! `<N>` (N the syslog severity, 0 emergency .. 7 debug: sd-daemon's
//! convention, which journald reads too).
//!
//! The VM opens gpud's port with `stderr_to_stdout`, so these lines and the
//! protocol lines on stdout (`startup ...`, `ready ...`, `backend ...`, `error ...`) share
//! one pipe; `erlcuda_gpud_log` turns every `<N>` line into an OTP logger
//! event at that level, with the device and gpud's OS pid as metadata, and
//! reads the rest as the protocol.
//!
//! Invariant that keeps the two streams from tearing each other's lines: a
//! line is written with a single write(2) of at most [`MAX_LINE`] bytes
//! (below PIPE_BUF, 4096 on Linux, so the kernel never interleaves it with
//! another writer's), here and in `daemon::announce`. Longer messages are cut
//! at a character boundary, and a message with newlines becomes several
//! lines, each with the prefix.

use std::fmt;
use std::io::Write;

/// The longest line written at once, newline included.
pub const MAX_LINE: usize = 4000;

/// Severities in syslog order; the VM maps them to logger levels of the
/// same names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Critical = 2,
    Error = 3,
    Warning = 4,
    Notice = 5,
    Info = 6,
    Debug = 7,
}

/// Writes `args` as one log line (or one per line of the message) at `level`.
pub fn line(level: Level, args: fmt::Arguments<'_>) {
    let text = fmt::format(args);
    let mut buf = String::with_capacity(text.len() + 8);
    for part in text.split('\n') {
        push_line(&mut buf, level, part);
    }
    // One write of each chunk of whole lines: stderr is unbuffered, and a
    // write to a pipe of at most PIPE_BUF bytes is atomic.
    let mut err = std::io::stderr().lock();
    for chunk in chunks(&buf) {
        let _ = err.write_all(chunk.as_bytes());
    }
}

fn push_line(buf: &mut String, level: Level, text: &str) {
    let prefix = format!("<{}>", level as u8);
    let room = MAX_LINE - prefix.len() - 1;
    let mut cut = text.len().min(room);
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    buf.push_str(&prefix);
    buf.push_str(&text[..cut]);
    buf.push('\n');
}

/// Splits whole lines into pieces of at most MAX_LINE bytes.
fn chunks(buf: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut end) = (0, 0);
    for (i, _) in buf.match_indices('\n') {
        if i + 1 - start > MAX_LINE {
            out.push(&buf[start..end]);
            start = end;
        }
        end = i + 1;
    }
    if end > start {
        out.push(&buf[start..end]);
    }
    out
}

/// `log!(Warning, "gpud[{}]: ...", device)`: a line at that [`Level`].
#[macro_export]
macro_rules! log {
    ($level:ident, $($arg:tt)*) => {
        $crate::log::line($crate::log::Level::$level, format_args!($($arg)*))
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_every_line_and_cuts_long_ones() {
        let mut buf = String::new();
        push_line(&mut buf, Level::Warning, "a");
        assert_eq!(buf, "<4>a\n");
        let long = "é".repeat(3000);
        let mut buf = String::new();
        push_line(&mut buf, Level::Info, &long);
        assert!(buf.len() <= MAX_LINE && buf.starts_with("<6>é") && buf.ends_with("é\n"));
    }

    #[test]
    fn chunks_hold_whole_lines() {
        let mut buf = String::new();
        for _ in 0..5 {
            push_line(&mut buf, Level::Error, &"x".repeat(1500));
        }
        let cs = chunks(&buf);
        assert_eq!(cs.concat(), buf);
        assert!(cs.iter().all(|c| c.len() <= MAX_LINE && c.ends_with('\n')));
        assert_eq!(cs.len(), 3);
    }
}
