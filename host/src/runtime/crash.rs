//! What a crashed guest left on its stderr, read for people: a one-line
//! reason (for the HTTP client and the log) and the whole story (the
//! traceback or stack, for the log and the conformance kit).
//!
//! Each language runtime says it differently: CPython (componentize-py)
//! prints a traceback and then the runtime panics with "Python function
//! threw an unexpected exception"; StarlingMonkey (componentize-js) says
//! which value it could not lower ("received `Error: …`"), prints `Stack:`
//! and aborts; Rust prints "panicked at FILE:LINE" and the message. The
//! last line is the least useful in the first two, so it is not enough.

use super::text::{escape_controls, truncate};

/// Longest reason kept: it goes into an HTTP answer.
const MAX_REASON: usize = 512;
/// Most of the stderr kept as the detail (its end, where the error is).
const MAX_DETAIL: usize = 8 * 1024;

/// A crash, as its stderr tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crash {
    /// One line: the exception and its message, or a panic's message.
    pub reason: String,
    /// What the guest wrote to stderr (its end), noise removed.
    pub detail: String,
}

/// Lines the runtimes add after the story, which say nothing about it.
fn noise(line: &str) -> bool {
    let line = line.trim();
    line.is_empty()
        || line.starts_with("note: run with `RUST_BACKTRACE")
        || line.starts_with("Redirecting call to abort()")
        || line == "Python function threw an unexpected exception"
}

/// A trap in words: the one-line reason a client gets (the exception or
/// panic message, else the trap's kind) and, when the guest wrote one, its
/// stderr for the log and the kit (the wasm backtrace stays in `error`).
pub fn explain(error: &wasmtime::Error, stderr: &[u8]) -> (String, Option<String>) {
    let crash = read(stderr);
    let reason = match (&crash, error.downcast_ref::<wasmtime::Trap>()) {
        (Some(crash), _) => crash.reason.clone(),
        (None, Some(trap)) => trap.to_string(),
        (None, None) => error
            .to_string()
            .lines()
            .next()
            .unwrap_or_default()
            .to_string(),
    };
    (reason, crash.map(|c| c.detail))
}

/// Read `stderr`; `None` when the guest wrote nothing useful.
pub fn read(stderr: &[u8]) -> Option<Crash> {
    let text = String::from_utf8_lossy(stderr);
    let lines: Vec<&str> = text.lines().filter(|l| !noise(l)).collect();
    let reason = python_exception(&lines)
        .or_else(|| javascript_exception(&lines))
        .or_else(|| rust_panic(&lines))
        .or_else(|| lines.last().map(|l| l.trim().to_string()))?;
    let detail = lines
        .iter()
        .map(|l| escape_controls(l))
        .collect::<Vec<_>>()
        .join("\n");
    let start = detail.len().saturating_sub(MAX_DETAIL);
    let start = (start..=detail.len())
        .find(|&i| detail.is_char_boundary(i))
        .unwrap_or(detail.len());
    Some(Crash {
        reason: truncate(&escape_controls(&reason), MAX_REASON),
        detail: detail[start..].to_string(),
    })
}

/// CPython's traceback ends with the exception's line, `Type: message`:
/// the first line after the last `Traceback` header that is not indented.
fn python_exception(lines: &[&str]) -> Option<String> {
    let header = lines
        .iter()
        .rposition(|l| l.starts_with("Traceback (most recent call last):"))?;
    lines[header + 1..]
        .iter()
        .find(|l| !l.starts_with(char::is_whitespace))
        .map(|l| l.trim().to_string())
}

/// componentize-js names the value it could not return as the contract's
/// error: an uncaught exception, `received `Error: message``. Otherwise the
/// line before `Stack:` says what went wrong.
fn javascript_exception(lines: &[&str]) -> Option<String> {
    for line in lines {
        if let Some((_, rest)) = line.split_once("(received `")
            && let Some((value, _)) = rest.split_once("`)")
        {
            return Some(format!(
                "uncaught {value} (throw the contract's error variant, such as {{ tag: 'internal', val: message }})"
            ));
        }
    }
    let stack = lines.iter().position(|l| l.trim() == "Stack:")?;
    stack.checked_sub(1).map(|i| lines[i].trim().to_string())
}

/// Rust's panic message is on the line after `panicked at FILE:LINE:COL:`.
fn rust_panic(lines: &[&str]) -> Option<String> {
    let at = lines.iter().rposition(|l| l.contains("panicked at"))?;
    lines.get(at + 1).map(|l| l.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::read;

    #[test]
    fn python_names_the_exception_not_the_runtime() {
        let stderr = "Traceback (most recent call last):\n  File \"/0/app.py\", line 223, in read\nValueError: oops in read\n\nthread '<unnamed>' (1) panicked at runtime/src/lib.rs:1293:29:\nPython function threw an unexpected exception\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        let crash = read(stderr.as_bytes()).unwrap();
        assert_eq!(crash.reason, "ValueError: oops in read");
        assert!(
            crash.detail.contains("line 223, in read"),
            "{}",
            crash.detail
        );
        assert!(!crash.detail.contains("RUST_BACKTRACE"));
    }

    #[test]
    fn javascript_names_the_uncaught_value() {
        let stderr = "invalid variant tag value `undefined` (received `Error: oops in read`) specified for `Error`\nStack:\n  export_storage_0_2_0$read@/tmp/x/sources/initializer.js:16415:17\n\nRedirecting call to abort() to mozalloc_abort\n\n";
        let crash = read(stderr.as_bytes()).unwrap();
        assert!(
            crash.reason.starts_with("uncaught Error: oops in read"),
            "{}",
            crash.reason
        );
        assert!(crash.detail.contains("initializer.js:16415"));
        let other = "TypeError: x is undefined\nStack:\n  f@guest.js:3:1\n";
        assert_eq!(
            read(other.as_bytes()).unwrap().reason,
            "TypeError: x is undefined"
        );
    }

    #[test]
    fn rust_gives_the_panic_message_and_nothing_gives_none() {
        let stderr = "thread '<unnamed>' panicked at src/lib.rs:10:5:\nindex out of bounds\nnote: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n";
        assert_eq!(
            read(stderr.as_bytes()).unwrap().reason,
            "index out of bounds"
        );
        assert_eq!(read(b""), None);
        assert_eq!(
            read(b"\n\nRedirecting call to abort() to mozalloc_abort\n"),
            None
        );
    }

    #[test]
    fn the_reason_is_one_bounded_line() {
        let long = format!(
            "Traceback (most recent call last):\nValueError: {}\u{1b}[2J",
            "x".repeat(5000)
        );
        let crash = read(long.as_bytes()).unwrap();
        assert!(crash.reason.len() <= 520 && !crash.reason.contains('\u{1b}'));
        let bell =
            read(b"Traceback (most recent call last):\nValueError: \x1b]0;title\x07\n").unwrap();
        assert!(!bell.detail.contains('\u{1b}') && !bell.detail.contains('\u{7}'));
    }
}
