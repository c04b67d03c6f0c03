//! The documentation links only inside the repository, and every link
//! resolves: a file that exists, a heading that exists.

use std::path::{Path, PathBuf};

fn repository() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .canonicalize()
        .unwrap()
}

/// Every Markdown file of the repository (not the build output, nor npm's).
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            // Not the build output, nor the browser tests' installed npm packages.
            if !name.starts_with('.') && name != "target" && name != "node_modules" {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

/// The targets of `[text](target)` and `[label]: target`, outside code blocks.
fn links(markdown: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            rest = &rest[at + 2..];
            let end = rest.find(')').unwrap_or(rest.len());
            out.push(rest[..end].trim().to_owned());
        }
        if let Some(def) = line.trim_start().strip_prefix('[')
            && let Some((_, target)) = def.split_once("]:")
        {
            out.push(target.trim().to_owned());
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn anchors(markdown: &str) -> Vec<String> {
    markdown
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix('#'))
        .map(|h| {
            h.trim_start_matches('#')
                .trim()
                .to_lowercase()
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
                .map(|c| if c == ' ' { '-' } else { c })
                .collect()
        })
        .collect()
}

#[test]
fn every_documentation_link_resolves_inside_the_repository() {
    let root = repository();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.iter().any(|f| f.ends_with("README.md")), "{files:?}");
    assert!(
        files.iter().any(|f| f.ends_with("docs/CONTRACT.md")),
        "{files:?}"
    );
    let mut broken = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let shown = file.strip_prefix(&root).unwrap().display().to_string();
        for link in links(&text) {
            if link.contains("://") || link.starts_with("mailto:") {
                broken.push(format!("{shown}: {link} leaves the repository"));
                continue;
            }
            let (path, anchor) = link.split_once('#').unwrap_or((&link, ""));
            let target = if path.is_empty() {
                file.clone()
            } else {
                match file.parent().unwrap().join(path).canonicalize() {
                    Ok(target) => target,
                    Err(_) => {
                        broken.push(format!("{shown}: {link} does not exist"));
                        continue;
                    }
                }
            };
            if !target.starts_with(&root) {
                broken.push(format!("{shown}: {link} leaves the repository"));
                continue;
            }
            if !anchor.is_empty() {
                let headings = anchors(&std::fs::read_to_string(&target).unwrap_or_default());
                if !headings.iter().any(|h| h == anchor) {
                    broken.push(format!(
                        "{shown}: {link} names no heading of {}",
                        target.display()
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_checker_sees_links_and_headings() {
    let text = "See [a](docs/A.md#one-two) and [b](../x).\n```\n[not](a link)\n```\n[c]: C.md\n## One: Two\n";
    assert_eq!(links(text), ["docs/A.md#one-two", "../x", "C.md"]);
    assert_eq!(anchors(text), ["one-two"]);
}
