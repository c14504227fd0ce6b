//! The documentation's links hold: every relative link in README.md and
//! docs/*.md names a file that exists, and every `#anchor` names a heading
//! of its target (GitHub's slugs). The README is a map of chapters, so a
//! renamed heading or a moved file would otherwise leave a newcomer at a
//! dead end without anyone noticing.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// GitHub's anchor for a heading: lower case, punctuation other than `-`
/// and `_` dropped, spaces to `-`; a repeated slug gets `-1`, `-2`, ...
fn slugs(markdown: &str) -> HashSet<String> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#');
        if !text.starts_with(' ') {
            continue;
        }
        let base: String = text
            .trim()
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut slug = base.clone();
        let mut n = 0;
        while seen.contains(&slug) {
            n += 1;
            slug = format!("{base}-{n}");
        }
        seen.insert(slug);
    }
    seen
}

/// Every `[text](target)` outside fenced code blocks and inline code.
fn links(markdown: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    for (no, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code may hold `](` that is not a link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(i) = rest.find("](") {
            rest = &rest[i + 2..];
            let Some(end) = rest.find(')') else { break };
            out.push((no + 1, rest[..end].to_owned()));
            rest = &rest[end..];
        }
    }
    out
}

/// The broken links of one file, as `file:line: target (why)`.
fn broken_in(file: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    let dir = file.parent().expect("a file's directory");
    let mut broken = Vec::new();
    for (line, target) in links(&text) {
        if target.contains("://") || target.starts_with("mailto:") {
            continue;
        }
        let (path, anchor) = match target.split_once('#') {
            Some((p, a)) => (p, Some(a)),
            None => (target.as_str(), None),
        };
        let resolved = if path.is_empty() {
            file.to_path_buf()
        } else {
            dir.join(path)
        };
        let at = format!("{}:{line}: {target}", file.display());
        if !resolved.exists() {
            broken.push(format!("{at} (no such file)"));
            continue;
        }
        if let Some(anchor) = anchor {
            let body = std::fs::read_to_string(&resolved).unwrap_or_default();
            if !slugs(&body).contains(anchor) {
                broken.push(format!("{at} (no heading with that anchor)"));
            }
        }
    }
    broken
}

fn documentation() -> Vec<PathBuf> {
    let root = root();
    let mut files = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.expect("a docs/ entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    files.extend(docs);
    files
}

#[test]
fn every_link_in_the_readme_and_the_docs_leads_somewhere() {
    let files = documentation();
    assert!(files.len() > 5, "README.md and the chapters: {files:?}");
    let checked: usize = files
        .iter()
        .map(|f| links(&std::fs::read_to_string(f).unwrap()).len())
        .sum();
    assert!(
        checked > 20,
        "only {checked} links found: is the parser reading them?"
    );
    let broken: Vec<String> = files.iter().flat_map(|f| broken_in(f)).collect();
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_links_every_chapter() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let linked: Vec<String> = links(&readme).into_iter().map(|(_, t)| t).collect();
    let unlinked: Vec<String> = documentation()
        .iter()
        .skip(1)
        .map(|p| format!("docs/{}", p.file_name().unwrap().to_string_lossy()))
        .filter(|chapter| {
            !linked
                .iter()
                .any(|t| t.split('#').next() == Some(chapter.as_str()))
        })
        .collect();
    assert!(
        unlinked.is_empty(),
        "chapters the README does not link: {unlinked:?}"
    );
}

#[test]
fn the_checker_finds_a_missing_file_and_a_missing_anchor() {
    let dir = std::env::temp_dir().join(format!("slotgate-doclinks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("page.md");
    std::fs::write(
        &page,
        "# A page\n\n## Section two: `x`\n\n[ok](#section-two-x) [self](page.md#a-page) \
         [gone](nowhere.md) [bad anchor](#no-such-heading)\n\n```\n[in code](nowhere.md)\n```\n",
    )
    .unwrap();
    let broken = broken_in(&page);
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(broken.len(), 2, "{broken:#?}");
    assert!(
        broken[0].contains("nowhere.md (no such file)"),
        "{broken:#?}"
    );
    assert!(
        broken[1].contains("#no-such-heading (no heading"),
        "{broken:#?}"
    );
}
