//! Every relative link in the repository's Markdown files resolves: the file or directory exists,
//! and a `#fragment` into a Markdown file names one of its headings.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
};

fn repository_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is inside the repository")
        .to_owned()
}

/// The Markdown files of the repository, outside build output and hidden directories.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a readable directory") {
        let path = entry.expect("a directory entry").path();
        let name = path
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or_default();
        if name.starts_with('.') || name == "target" {
            continue;
        }
        if path.is_dir() {
            markdown_files(&path, found);
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// The text outside fenced code blocks, where links are links.
fn prose(markdown: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    markdown.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The targets of the inline links `[text](target)` of `line`.
fn link_targets(line: &str) -> Vec<&str> {
    line.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &line[at + 2..];
            rest.find(')').map(|end| &rest[..end])
        })
        .collect()
}

/// The anchors GitHub gives a file's headings: lower case, punctuation dropped, spaces as `-`,
/// a repeated heading numbered from `-1`.
fn anchors(markdown: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for heading in prose(markdown).filter_map(|line| line.strip_prefix('#')) {
        let text = heading.trim_start_matches('#').trim();
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut unique = slug.clone();
        let mut repeat = 0;
        while !anchors.insert(unique.clone()) {
            repeat += 1;
            unique = format!("{slug}-{repeat}");
        }
    }
    anchors
}

#[test]
fn every_relative_link_in_the_markdown_files_resolves() {
    let root = repository_root();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(
        files.len() > 10,
        "the repository's Markdown files were found: {files:?}"
    );
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("a readable file");
        for target in prose(&text).flat_map(link_targets) {
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (path, fragment) = target
                .split_once('#')
                .map_or((target, None), |(path, fragment)| (path, Some(fragment)));
            let linked = if path.is_empty() {
                file.clone()
            } else {
                file.parent().expect("a file's directory").join(path)
            };
            let shown = file.strip_prefix(&root).unwrap_or(file).display();
            if !linked.exists() {
                broken.push(format!("{shown}: {target}: no such file"));
                continue;
            }
            if let Some(fragment) = fragment.filter(|_| {
                linked
                    .extension()
                    .is_some_and(|extension| extension == "md")
            }) {
                let linked_text = std::fs::read_to_string(&linked).expect("a readable file");
                if !anchors(&linked_text).contains(fragment) {
                    broken.push(format!("{shown}: {target}: no such heading"));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken links:\n{}",
        broken.len(),
        broken.join("\n")
    );
}
