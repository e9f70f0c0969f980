//! What the host and guests both read of a state's bytes, whoever wrote
//! it: its `lineage` and `serial`, which Terraform and OpenTofu write
//! first, from a prefix of it.

/// `lineage` and `serial` from the beginning of a state, which may be cut
/// anywhere after them: the top-level keys are read in order until both
/// were seen, and nothing after them is looked at. `None` when the prefix
/// does not hold both (a state that has neither, or writes them late).
pub fn version_in_prefix(prefix: &[u8]) -> Option<(String, u64)> {
    use serde::de::{IgnoredAny, MapAccess, Visitor};
    use serde_json::value::RawValue;

    /// Walks the top-level object of `input`, leaving what it found in
    /// `found`.
    struct Seek<'a, 'de> {
        input: &'de [u8],
        found: &'a mut (Option<String>, Option<u64>),
    }

    impl<'de> Visitor<'de> for Seek<'_, 'de> {
        type Value = ();

        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "lineage" => self.found.0 = map.next_value()?,
                    "serial" => {
                        // A number that runs to the end of the prefix may
                        // have been cut (`1234` read as `12`): unknown.
                        let raw: &RawValue = map.next_value()?;
                        let text = raw.get();
                        let end =
                            text.as_ptr() as usize - self.input.as_ptr() as usize + text.len();
                        self.found.1 = if end >= self.input.len() {
                            None
                        } else {
                            serde_json::from_str(text).map_err(serde::de::Error::custom)?
                        };
                        if self.found.1.is_none() {
                            return Ok(());
                        }
                    }
                    _ => {
                        map.next_value::<IgnoredAny>()?;
                    }
                }
                if self.found.0.is_some() && self.found.1.is_some() {
                    // Stop here: the rest may be cut off.
                    return Ok(());
                }
            }
            Ok(())
        }
    }

    let mut found = (None, None);
    let mut json = serde_json::Deserializer::from_slice(prefix);
    // Stopping early (or a prefix cut mid-value) is an error to serde_json
    // once the visitor returns; what was found before that still counts.
    let seek = Seek {
        input: prefix,
        found: &mut found,
    };
    let _ = serde::Deserializer::deserialize_map(&mut json, seek);
    Some((found.0.filter(|l| !l.is_empty())?, found.1?))
}

/// `lineage` and `serial` from the end of a state that keeps them last
/// (wasmstate's sealed envelope puts them after the ciphertext): the last
/// top-level `"serial":` key of `tail` and what follows it. Inside a JSON
/// string every `"` is escaped, so `"serial":` there starts a key; `None`
/// when `tail` holds none (or a lineage longer than it).
pub fn version_in_tail(tail: &[u8]) -> Option<(String, u64)> {
    let key = b"\"serial\":";
    let at = tail.windows(key.len()).rposition(|w| w == key)?;
    let mut object = Vec::with_capacity(tail.len() - at + 1);
    object.push(b'{');
    object.extend_from_slice(&tail[at..]);
    version_in_prefix(&object)
}

#[cfg(test)]
mod tests {
    use super::{version_in_prefix, version_in_tail};

    #[test]
    fn finds_lineage_and_serial_at_the_end() {
        let tail = br#"AAAA=="},"serial":7,"lineage":"a\"serial\":9"}"#;
        assert_eq!(
            version_in_tail(tail),
            Some((r#"a"serial":9"#.to_string(), 7))
        );
        assert_eq!(version_in_tail(b"no serial here"), None);
    }

    #[test]
    fn finds_lineage_and_serial_in_a_cut_prefix() {
        let state = br#"{"version":4,"terraform_version":"1.11.4","serial":12,"lineage":"abc","resources":[{"#;
        assert_eq!(version_in_prefix(state), Some(("abc".to_string(), 12)));
        // The serial runs to the end of the prefix: it may have been cut.
        assert_eq!(version_in_prefix(br#"{"lineage":"abc","serial":12"#), None);
        assert_eq!(version_in_prefix(b"not json"), None);
    }
}
