//! A stranger's signing grant is a namespace of its own on its bucket.
//!
//! Every object a backend's layout touches (its state `key`, a workspace's
//! `<workspace_key_prefix>/<workspace>/<key>`, their `.tflock` files,
//! listings with those prefixes) starts with one of two strings: the key,
//! or the prefix and `/`. Every DynamoDB `LockID` (`<bucket>/<state key>`,
//! `<bucket>/<state key>-md5`) is the bucket, `/` and such an object key.
//! So each backend's namespace is the two strings `<bucket>/<key>` and
//! `<bucket>/<prefix>/` (a bucket name holds no `/`): when no string of
//! one backend starts with a string of another, no object or `LockID` of
//! one can be one of the other's, on the same bucket or through a table
//! shared across buckets. A stranger's grant (a guest that is not
//! first-party) is refused at load when its namespace is not disjoint
//! from every other backend's so served.

use super::SigningScope;

impl SigningScope {
    /// The strings every object and `LockID` this backend's layout
    /// touches starts with (see the module's doc). A layout with no `key`
    /// or an empty prefix reaches every key of its bucket: its string is
    /// then the bucket and `/` alone.
    fn namespace(&self) -> [String; 2] {
        // Host names, and some stores, take a bucket's name in any case.
        let bucket = self
            .bucket
            .as_deref()
            .unwrap_or_default()
            .to_ascii_lowercase();
        let key = self.key.as_deref().unwrap_or_default();
        let prefix = match self.workspace_prefix.as_str() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        [format!("{bucket}/{key}"), format!("{bucket}/{prefix}")]
    }
}

/// `Err` (one line) when a stranger's layout among `backends` (name,
/// scope) overlaps another backend's: the first such pair in name order.
/// First-party backends may share a layout among themselves (an operator
/// can serve one bucket twice); a stranger never shares one.
pub fn check_disjoint(backends: &[(&str, &SigningScope)]) -> Result<(), String> {
    // Sorted, a string's extensions follow it directly: whatever lies
    // between a string and one it is a prefix of starts with it too. Equal
    // strings of first-party backends are kept once (they may overlap),
    // so the scan from each string stays short unless it is refused.
    let mut strings: Vec<(String, usize)> = Vec::with_capacity(backends.len() * 2);
    let mut first_party = std::collections::HashSet::new();
    for (i, (_, scope)) in backends.iter().enumerate() {
        for s in scope.namespace() {
            if scope.stranger || first_party.insert(s.clone()) {
                strings.push((s, i));
            }
        }
    }
    strings.sort();
    strings.dedup();
    let mut clash: Option<(usize, usize, &str, &str)> = None;
    for (at, (a, i)) in strings.iter().enumerate() {
        for (b, j) in strings[at + 1..]
            .iter()
            .take_while(|(b, _)| b.starts_with(a.as_str()))
        {
            if i != j && (backends[*i].1.stranger || backends[*j].1.stranger) {
                let pair = (*i.min(j), *i.max(j), a.as_str(), b.as_str());
                if clash.is_none_or(|c| (pair.0, pair.1) < (c.0, c.1)) {
                    clash = Some(pair);
                }
            }
        }
    }
    let Some((i, j, _, _)) = clash else {
        return Ok(());
    };
    let (stranger, other) = match backends[i].1.stranger {
        true => (i, j),
        false => (j, i),
    };
    let shown = |k: usize| {
        let scope = backends[k].1;
        format!(
            "backends.{} (bucket {:?}, key {:?}, workspace_key_prefix {:?})",
            backends[k].0,
            scope.bucket.as_deref().unwrap_or_default(),
            scope.key.as_deref().unwrap_or_default(),
            scope.workspace_prefix
        )
    };
    Err(format!(
        "{}: its states overlap those of {}: a guest that is not first-party gets AWS requests signed only in a namespace of its own; set its key and workspace_key_prefix so that neither starts with the other backend's key or prefix, nor theirs with its own",
        shown(stranger),
        shown(other)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owned(config: &[(&str, &str)]) -> Vec<(String, String)> {
        config
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn stranger(config: &[(&str, &str)]) -> SigningScope {
        SigningScope::for_stranger(&owned(config)).unwrap()
    }

    /// Issue 47, review F1: a stranger whose layout overlaps another
    /// backend's on its bucket (its workspace `other` being another
    /// tenant's default state, a shared `env:` prefix, a key one starts
    /// with) is refused, naming both; disjoint ones and first-party
    /// backends sharing a layout are not.
    #[test]
    fn a_strangers_layout_must_not_overlap_another_backends() {
        let first = SigningScope::from_config(&owned(&[
            ("bucket", "states"),
            ("key", "tenants/other/terraform.tfstate"),
        ]));
        let twin = first.clone();
        let refused = |other: &SigningScope, s: &SigningScope| {
            check_disjoint(&[("first", other), ("tenant", s)]).unwrap_err()
        };
        // Its workspace `other` is `tenants/other/terraform.tfstate`.
        let overlapping = stranger(&[
            ("bucket", "states"),
            ("key", "terraform.tfstate"),
            ("workspace_key_prefix", "tenants"),
        ]);
        let e = refused(&first, &overlapping);
        assert!(e.starts_with("backends.tenant (bucket \"states\""), "{e}");
        assert!(e.contains("backends.first"), "{e}");
        assert!(!e.contains('\n'), "{e}");
        // Both under the default prefix `env:`.
        let shared_prefix = stranger(&[("bucket", "states"), ("key", "acme/terraform.tfstate")]);
        refused(&first, &shared_prefix);
        // A key that is another's key with a suffix (`-md5` LockIDs).
        let suffixed = stranger(&[
            ("bucket", "states"),
            ("key", "tenants/other/terraform.tfstate-md5"),
            ("workspace_key_prefix", "acme"),
        ]);
        let other_prefix = SigningScope::from_config(&owned(&[
            ("bucket", "states"),
            ("key", "tenants/other/terraform.tfstate"),
            ("workspace_key_prefix", "other"),
        ]));
        refused(&other_prefix, &suffixed);
        // The same bucket in another case.
        let upper = stranger(&[
            ("bucket", "STATES"),
            ("key", "x/terraform.tfstate"),
            ("workspace_key_prefix", "tenants"),
        ]);
        refused(&first, &upper);
        // Two strangers, either order.
        let acme = stranger(&[
            ("bucket", "states"),
            ("key", "acme/terraform.tfstate"),
            ("workspace_key_prefix", "acme-env"),
        ]);
        let acme_twin = acme.clone();
        refused(&acme, &acme_twin);
        // A first-party backend naming no key or no prefix reaches the
        // whole bucket.
        let keyless = SigningScope::from_config(&owned(&[("bucket", "states")]));
        refused(&keyless, &acme);

        // Disjoint: another bucket (a table shared across buckets too),
        // or its own key and prefix on the same bucket.
        let elsewhere = SigningScope::from_config(&owned(&[
            ("bucket", "states-2"),
            ("key", "acme/terraform.tfstate"),
            ("workspace_key_prefix", "acme-env"),
        ]));
        assert_eq!(
            check_disjoint(&[
                ("first", &first),
                ("twin", &twin),
                ("acme", &acme),
                ("elsewhere", &elsewhere)
            ]),
            Ok(())
        );
    }
}
