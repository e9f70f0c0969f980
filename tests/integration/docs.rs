//! The README is a short front door to the pages in `docs/`, and they link
//! to each other and into the repository, so moving a section or a file
//! must not leave a link pointing nowhere: every relative link in
//! `README.md` and `docs/*.md` names an existing file and, with `#anchor`,
//! one of its headings (GitHub's anchors). The README stays ≤ 300 lines.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Past this, detail belongs in a page under `docs/`.
const README_MAX_LINES: usize = 300;

#[test]
fn every_relative_link_in_the_readme_and_docs_resolves() {
    let root = repo_root();
    let mut broken = Vec::new();
    for file in markdown_files(&root) {
        let prose = without_code_spans(&without_fences(&read(&file)));
        for (index, line) in prose.lines().enumerate() {
            for target in link_targets(line) {
                if !is_external(target) && !resolves(&file, target) {
                    let shown = file.strip_prefix(&root).unwrap_or(file.as_path());
                    broken.push(format!("{}:{}: {target}", shown.display(), index + 1));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_stays_a_short_front_door() {
    let lines = read(&repo_root().join("README.md")).lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, more than {README_MAX_LINES}: move detail into docs/"
    );
}

/// The repository root: the parent of the `host` crate these tests belong to.
fn repo_root() -> PathBuf {
    let host = Path::new(env!("CARGO_MANIFEST_DIR"));
    host.parent().expect("host/ has a parent").to_path_buf()
}

/// `README.md`, then every `docs/*.md` in name order (stable failure lists).
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("reading docs/")
        .map(|entry| entry.expect("reading an entry of docs/").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// Links to the web are not ours to check (and the tests run offline).
fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(*scheme))
}

/// Whether `target`, written in `file`, names an existing file or folder
/// and, when it has an `#anchor` into a markdown file, one of its headings.
/// A bare `#anchor` points into `file` itself.
fn resolves(file: &Path, target: &str) -> bool {
    let (path, anchor) = target.split_once('#').unwrap_or((target, ""));
    let dest = match path {
        "" => file.to_path_buf(),
        path => file.parent().expect("a file is in a folder").join(path),
    };
    if !dest.exists() || anchor.is_empty() || dest.extension().is_none_or(|ext| ext != "md") {
        return dest.exists();
    }
    anchors(&read(&dest)).iter().any(|known| known == anchor)
}

/// The targets of the inline links `[text](target)` on one line of prose
/// (without `"title"` or `<…>`, which markdown allows around a target).
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some((_, after)) = rest.split_once("](")
        && let Some((inside, next)) = after.split_once(')')
    {
        let target = inside.split_whitespace().next().unwrap_or("");
        targets.push(target.trim_start_matches('<').trim_end_matches('>'));
        rest = next;
    }
    targets
}

/// The text with fenced code blocks blanked: a `#` comment or a `[x](y)` in
/// code is not markdown. Line breaks are kept so line numbers stay right.
fn without_fences(text: &str) -> String {
    let mut fenced = false;
    let mut lines = Vec::new();
    for line in text.lines() {
        let fence = line.trim_start().starts_with("```");
        if fence {
            fenced = !fenced;
        }
        lines.push(if fence || fenced { "" } else { line });
    }
    lines.join("\n")
}

/// The text with each inline code span replaced by `x` (keeping the line
/// breaks inside it), so a link shown as code is not checked while a link
/// whose text is a code span still is. A span opened by N backticks closes
/// at the next N; an opening run that never closes is plain text.
fn without_code_spans(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(start) = rest.find('`') {
        out.push_str(&rest[..start]);
        let inside = rest[start..].trim_start_matches('`');
        let ticks = &rest[start..rest.len() - inside.len()];
        match inside.find(ticks) {
            Some(end) => {
                out.push('x');
                out.extend(inside[..end].matches('\n'));
                rest = inside[end..].trim_start_matches('`');
            }
            None => {
                out.push_str(ticks);
                rest = inside;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The anchors GitHub gives a markdown file's headings; a repeated heading
/// gets `-1`, `-2`… after its slug.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = Vec::new();
    for line in without_fences(text).lines() {
        let level = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&level) {
            continue;
        }
        let Some(title) = line[level..].strip_prefix(' ') else {
            continue;
        };
        let base = slug(title.trim().trim_end_matches('#'));
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.push(match *count {
            0 => base,
            n => format!("{base}-{n}"),
        });
        *count += 1;
    }
    anchors
}

/// GitHub's slug of a heading: lowercase; letters, digits, `-` and `_`
/// kept; each space becomes `-`; other punctuation (and backticks) dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}
