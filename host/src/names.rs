//! The one rule for names that become path segments, file names and storage
//! keys: workspace names and backend names.

/// Longest accepted name. Terraform's S3 backend keys and git branch names
/// both stay comfortably within limits at this length.
pub const MAX_NAME_LEN: usize = 90;

/// Check a workspace or backend name: 1 to 90 characters of
/// `A-Z a-z 0-9 . _ -`, not starting with `.` (which also excludes `.` and
/// `..`). Returns a one-line reason when the name is refused.
pub fn check_name(kind: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{kind} name is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!(
            "{kind} name is {} characters long; the limit is {MAX_NAME_LEN}",
            name.len()
        ));
    }
    if name.starts_with('.') {
        return Err(format!("{kind} name {name:?} must not start with '.'"));
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
    {
        return Err(format!(
            "{kind} name {name:?} contains {bad:?}; use only letters, digits, '.', '_' and '-'"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn accepts_ordinary_names() {
        for name in ["default", "prod", "team-a_1.2", "X"] {
            assert!(check_name("workspace", name).is_ok(), "{name}");
        }
    }

    #[test]
    fn refuses_traversal_separators_and_control_characters() {
        for name in [
            "", ".", "..", ".hidden", "a/b", "a\\b", "a\nb", "a\0b", "ü", "a b",
        ] {
            assert!(check_name("workspace", name).is_err(), "{name:?}");
        }
        assert!(check_name("workspace", &"a".repeat(91)).is_err());
        assert!(check_name("workspace", &"a".repeat(90)).is_ok());
    }
}
