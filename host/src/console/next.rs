//! Where a browser goes after signing in: back to the console page it
//! asked for, never to another site.

/// `next` when it is a page of this console: a path under `/ui/` (so
/// never another origin: not `//host`, not `https:`, no backslash, which
/// some browsers read as a slash), and not the sign-in page itself.
pub(super) fn safe_next(next: &str) -> Option<&str> {
    let page = next.strip_prefix("/ui/")?;
    let fine = next.len() <= 2048
        && !page.starts_with('/')
        && !page.starts_with("login")
        && !next.contains('\\')
        && !next.chars().any(|c| c.is_control() || c.is_whitespace());
    fine.then_some(next)
}

/// The sign-in page, going back to `next` after it.
pub(super) fn login_url(next: Option<&str>) -> String {
    match next {
        Some(next) => format!(
            "/ui/login?next={}",
            url::form_urlencoded::byte_serialize(next.as_bytes()).collect::<String>()
        ),
        None => "/ui/login".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_console_pages_are_gone_back_to_after_signing_in() {
        assert_eq!(
            safe_next("/ui/backends/default"),
            Some("/ui/backends/default")
        );
        assert_eq!(
            safe_next("/ui/backends/b/w?from=1&to=current"),
            Some("/ui/backends/b/w?from=1&to=current")
        );
        for elsewhere in [
            "//evil.example/ui/x",
            "https://evil.example/ui/",
            "/ui//evil.example",
            "/ui/\\evil.example",
            "/\\evil.example",
            "/ui/login?next=/ui/x",
            "/ui/x\r\nSet-Cookie: a=b",
            "/states/default/default",
            "",
        ] {
            assert_eq!(safe_next(elsewhere), None, "{elsewhere:?}");
        }
        assert_eq!(
            login_url(Some("/ui/backends/a b")),
            "/ui/login?next=%2Fui%2Fbackends%2Fa+b"
        );
    }
}
