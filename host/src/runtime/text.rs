//! Text a guest hands the host (errors, log lines, lock fields), made safe
//! to show: bounded in length, one line.

/// `s` with control characters (newlines, escapes, NULs) written as
/// escapes (`\n`, `\u{1b}`).
pub fn escape_controls(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `s`, cut to at most `max` bytes (on a character boundary) with `…`.
pub fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
