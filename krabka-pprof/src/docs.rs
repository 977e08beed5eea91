//! User docs written once: the attribute's keys and the HTTP contract live in `docs/` and
//! rustdoc includes them. README.md and the macro crate cannot include a file of this
//! crate, so they hold copies; these tests fail, naming the file to edit, when one drifts.

use std::path::{Path, PathBuf};

const KEYS: &str = include_str!("../docs/keys.md");
const HTTP: &str = include_str!("../docs/http.md");

/// A file of the repository, by its path from the repository's root.
fn repository_file(path: &str) -> String {
    let full: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("cannot read {}: {e}", full.display()))
}

/// The heading's level if `line` is a Markdown heading (`## Title` is 2).
fn heading_level(line: &str) -> Option<usize> {
    let level = line.bytes().take_while(|&b| b == b'#').count();
    (level > 0 && line[level..].starts_with(' ')).then_some(level)
}

/// The text under `heading`, up to the next heading of the same or a higher level (a `#`
/// inside a code block is not a heading), without the blank lines around it.
fn section(markdown: &str, heading: &str) -> Option<String> {
    let mut lines = markdown.lines();
    lines.by_ref().find(|line| *line == heading)?;
    let level = heading_level(heading)?;
    let mut in_code = false;
    let mut body = Vec::new();
    for line in lines {
        if line.starts_with("```") {
            in_code = !in_code;
        }
        if !in_code && heading_level(line).is_some_and(|l| l <= level) {
            break;
        }
        body.push(line);
    }
    Some(body.join("\n").trim_matches('\n').to_owned())
}

/// Fails with the first differing line and what to do, if `copy` is not `source`.
fn assert_same(source: &str, source_path: &str, copy: &str, copy_place: &str) {
    let (source, copy) = (source.trim_matches('\n'), copy.trim_matches('\n'));
    if source == copy {
        return;
    }
    let (copy_lines, source_lines): (Vec<&str>, Vec<&str>) =
        (copy.lines().collect(), source.lines().collect());
    let at = (0..copy_lines.len().max(source_lines.len()))
        .find(|&i| copy_lines.get(i) != source_lines.get(i))
        .unwrap_or(0);
    let line = |lines: &[&str]| {
        lines
            .get(at)
            .map_or("<end of text>".to_owned(), |l| format!("{l:?}"))
    };
    let (in_copy, in_source, line) = (line(&copy_lines), line(&source_lines), at + 1);
    panic!(
        "{copy_place} differs from {source_path}, from its line {line} on:\n  \
         copy:   {in_copy}\n  source: {in_source}\n\
         Edit {source_path} (rustdoc shows it), then copy its whole text over {copy_place}."
    );
}

#[test]
fn readme_keys_match_the_docs() {
    let readme = repository_file("README.md");
    let copy = section(&readme, "### Keys").expect("README.md has a `### Keys` section");
    assert_same(
        KEYS,
        "krabka-pprof/docs/keys.md",
        &copy,
        "README.md's `### Keys` section",
    );
}

#[test]
fn readme_http_contract_matches_the_docs() {
    let readme = repository_file("README.md");
    let copy = section(&readme, "## The HTTP contract")
        .expect("README.md has a `## The HTTP contract` section");
    assert_same(
        HTTP,
        "krabka-pprof/docs/http.md",
        &copy,
        "README.md's `## The HTTP contract` section",
    );
}

#[test]
fn macro_crate_keys_match_the_docs() {
    let copy = repository_file("krabka-pprof-macros/docs/keys.md");
    assert_same(
        KEYS,
        "krabka-pprof/docs/keys.md",
        &copy,
        "krabka-pprof-macros/docs/keys.md",
    );
}

#[test]
fn sections_end_at_the_next_heading_outside_code() {
    let markdown =
        "# A\n\n## B\n\none\n```text\n# not a heading\n```\n### C\n\ntwo\n\n## D\nthree\n";
    assert_eq!(
        section(markdown, "## B").unwrap(),
        "one\n```text\n# not a heading\n```\n### C\n\ntwo"
    );
    assert_eq!(section(markdown, "## D").unwrap(), "three");
    assert_eq!(section(markdown, "## E"), None);
}
