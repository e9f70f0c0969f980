//! The wall clock as RFC 3339 text, as Terraform's `LockInfo.Created`
//! takes it: for a lock a guest takes itself, or one whose `Created` the
//! locker gave in another form.

/// Now, in UTC, as Go's `time.RFC3339Nano` writes it (trailing zeros of
/// the fraction dropped).
pub fn now_rfc3339() -> String {
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format_unix(since.as_secs(), since.subsec_nanos())
}

/// `secs` seconds and `nanos` nanoseconds after the Unix epoch.
fn format_unix(secs: u64, nanos: u32) -> String {
    let (days, rest) = (secs / 86_400, secs % 86_400);
    // Days to a civil date (Howard Hinnant's algorithm), from 1970-01-01.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let mut text = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}",
        rest / 3_600,
        rest % 3_600 / 60,
        rest % 60
    );
    if nanos > 0 {
        let fraction = format!("{nanos:09}");
        text.push('.');
        text.push_str(fraction.trim_end_matches('0'));
    }
    text.push('Z');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_as_go_does() {
        assert_eq!(format_unix(0, 0), "1970-01-01T00:00:00Z");
        assert_eq!(
            format_unix(1_709_251_199, 120_000_000),
            "2024-02-29T23:59:59.12Z"
        );
        assert_eq!(
            format_unix(1_767_366_245, 5),
            "2026-01-02T15:04:05.000000005Z"
        );
    }
}
