//! Log output that keeps one event on one line.
//!
//! Messages quote what others control: a guest's error, a client's lock
//! holder, a state's file name. A newline in one would start a line that
//! looks like the host's own, so every event's inner line breaks are
//! written as `\n` / `\r` before it reaches stderr.

use std::io::{self, Write};
use tracing_subscriber::fmt::MakeWriter;

/// Makes writers to stderr that escape line breaks inside an event.
#[derive(Debug, Clone, Copy, Default)]
pub struct OneLineStderr;

impl<'a> MakeWriter<'a> for OneLineStderr {
    type Writer = OneLine<io::Stderr>;

    fn make_writer(&'a self) -> Self::Writer {
        OneLine(io::stderr())
    }
}

/// A writer for whole formatted events (the fmt layer writes each with
/// one `write_all`): line breaks before the final one are escaped.
#[derive(Debug)]
pub struct OneLine<W>(pub W);

impl<W: Write> Write for OneLine<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let (body, end) = match buf.strip_suffix(b"\n") {
            Some(body) => (body, &b"\n"[..]),
            None => (buf, &b""[..]),
        };
        if !body.iter().any(|b| matches!(b, b'\n' | b'\r')) {
            self.0.write_all(buf)?;
            return Ok(buf.len());
        }
        let mut line = Vec::with_capacity(buf.len() + 16);
        for &byte in body {
            match byte {
                b'\n' => line.extend_from_slice(b"\\n"),
                b'\r' => line.extend_from_slice(b"\\r"),
                other => line.push(other),
            }
        }
        line.extend_from_slice(end);
        self.0.write_all(&line)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn written(input: &[u8]) -> Vec<u8> {
        let mut out = OneLine(Vec::new());
        out.write_all(input).unwrap();
        out.0
    }

    #[test]
    fn inner_line_breaks_are_escaped_and_the_last_kept() {
        assert_eq!(
            written(b"ERROR guest said: ok\nINFO forged\r\n"),
            b"ERROR guest said: ok\\nINFO forged\\r\n"
        );
        assert_eq!(written(b"plain line\n"), b"plain line\n");
        assert_eq!(written(b"no newline"), b"no newline");
    }
}
