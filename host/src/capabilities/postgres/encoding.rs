//! How a state is kept in the `data` column (text): Terraform's states,
//! which are JSON, as they are; anything else encoded, so every state a
//! guest writes comes back byte for byte.

use super::PgError;
use std::borrow::Cow;

/// How a state that is not UTF-8 text (never one of Terraform's, which
/// are JSON) is kept in the `data` column: base64 after this prefix, which
/// no JSON document starts with.
pub const BINARY_PREFIX: &str = "wasmstate-base64:";

/// `bytes` as the `data` column keeps them: Terraform's states as they
/// are, anything else (not UTF-8, holding a NUL, or beginning like an
/// encoded state) encoded.
pub fn as_text(bytes: &[u8]) -> Cow<'_, str> {
    use base64::Engine as _;
    match std::str::from_utf8(bytes) {
        // PostgreSQL's text holds no NUL.
        Ok(text) if !text.starts_with(BINARY_PREFIX) && !text.contains('\0') => text.into(),
        _ => format!(
            "{BINARY_PREFIX}{}",
            base64::engine::general_purpose::STANDARD.encode(bytes)
        )
        .into(),
    }
}

/// The state a `data` column holds.
pub fn from_text(data: &str) -> Result<Cow<'_, [u8]>, PgError> {
    use base64::Engine as _;
    match data.strip_prefix(BINARY_PREFIX) {
        None => Ok(data.as_bytes().into()),
        Some(encoded) => base64::engine::general_purpose::STANDARD
            .decode(encoded)
            .map(Into::into)
            .map_err(|e| PgError::Internal(format!("an encoded state is not base64: {e}"))),
    }
}

/// How many of the column's first bytes hold a state's first `want`
/// bytes, whichever way it is kept.
pub fn stored_prefix_len(want: usize) -> usize {
    BINARY_PREFIX.len() + want.div_ceil(3) * 4
}

/// The state's first bytes (at most `want`) from the column's first
/// bytes, as [`stored_prefix_len`] fetched them.
pub fn prefix_from_stored(stored: &[u8], want: usize) -> Result<Vec<u8>, PgError> {
    use base64::Engine as _;
    match stored.strip_prefix(BINARY_PREFIX.as_bytes()) {
        None => Ok(stored[..stored.len().min(want)].to_vec()),
        Some(encoded) => {
            // Whole groups of four only: a cut one is not base64.
            let whole = &encoded[..encoded.len() / 4 * 4];
            let mut bytes = base64::engine::general_purpose::STANDARD
                .decode(whole)
                .map_err(|e| PgError::Internal(format!("an encoded state is not base64: {e}")))?;
            bytes.truncate(want);
            Ok(bytes)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefix of a state read from the column's first bytes is the
    /// state's own first bytes, kept plain or encoded.
    #[test]
    fn a_prefix_decodes_like_the_whole_state() {
        let binary: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
        let json = br#"{"version":4,"serial":3,"lineage":"x"}"#.to_vec();
        for state in [binary, json] {
            let stored = as_text(&state).into_owned();
            assert_eq!(from_text(&stored).unwrap(), state.as_slice());
            for want in [1, 2, 3, 4, 10, 99, 5000] {
                let fetched = &stored.as_bytes()[..stored.len().min(stored_prefix_len(want))];
                let prefix = prefix_from_stored(fetched, want).unwrap();
                assert_eq!(prefix, state[..state.len().min(want)], "want {want}");
            }
        }
    }
}
