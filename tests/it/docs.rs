//! Links in the documentation: every relative link in the top-level `*.md`
//! files and in `docs/*.md` names a file that exists and, with an
//! `#anchor`, a heading of that file by GitHub's slug rule. `(#anchor)`
//! alone names a heading of the same file.
//!
//! No network: `http(s)://` and `mailto:` links are skipped. Links inside
//! fenced code blocks and inline code are not links, so they are skipped
//! too. Anchors are checked only in Markdown files (a forge's line anchors in
//! source files are not headings), so a link with an anchor into any other
//! file is reported.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// The Markdown files whose links are checked: the top level and `docs/`.
fn markdown_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for dir in [root.to_path_buf(), root.join("docs")] {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            if path.is_file() && path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// `text` with the lines of fenced code blocks blanked (kept empty, so line
/// numbers stay right).
fn without_fences(text: &str) -> String {
    let mut fence: Option<&str> = None;
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(f), Some(m)) if f == m => fence = None,
            _ => {}
        }
        if fence.is_some() || marker.is_some() {
            if line.ends_with('\n') {
                out.push('\n');
            }
        } else {
            out.push_str(line);
        }
    }
    out
}

/// `text` with the content of inline code spans (between equal runs of
/// backticks) replaced by spaces, newlines kept.
fn without_code_spans(text: &str) -> String {
    let chars: Vec<char> = text.chars().collect();
    let run = |at: usize| chars[at..].iter().take_while(|&&c| c == '`').count();
    let mut out = chars.clone();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '`' {
            i += 1;
            continue;
        }
        let n = run(i);
        // The closing run: the next run of exactly n backticks.
        let mut j = i + n;
        let mut close = None;
        while j < chars.len() {
            if chars[j] == '`' {
                let m = run(j);
                if m == n {
                    close = Some(j);
                    break;
                }
                j += m;
            } else {
                j += 1;
            }
        }
        match close {
            Some(j) => {
                for c in &mut out[i..j + n] {
                    if *c != '\n' {
                        *c = ' ';
                    }
                }
                i = j + n;
            }
            None => i += n,
        }
    }
    out.into_iter().collect()
}

/// GitHub's anchor for a heading's text: lowercase; letters, digits, `-`
/// and `_` kept; spaces become `-`; everything else dropped.
fn slug(heading: &str) -> String {
    heading
        .chars()
        .flat_map(char::to_lowercase)
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// `[text](target)` becomes `text`, as in a heading's anchor.
fn link_texts(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(open) = rest.find('[') {
        let Some(close) = rest[open..].find("](").map(|c| open + c) else {
            break;
        };
        let Some(end) = rest[close..].find(')').map(|e| close + e) else {
            break;
        };
        out.push_str(&rest[..open]);
        out.push_str(&rest[open + 1..close]);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
}

/// The anchors of a Markdown file's ATX headings; a repeated slug gets `-1`,
/// `-2`, ... as on GitHub.
fn anchors(text: &str) -> HashSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = HashSet::new();
    for line in without_fences(text).lines() {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let title = line[hashes..].trim().trim_end_matches('#').trim();
        let base = slug(&link_texts(title));
        let n = seen.entry(base.clone()).or_default();
        anchors.insert(if *n == 0 { base.clone() } else { format!("{base}-{n}") });
        *n += 1;
    }
    anchors
}

/// Every link target of a Markdown file with its line: inline links and
/// images `[text](target "title")`, and reference definitions `[x]: target`.
fn links(text: &str) -> Vec<(usize, String)> {
    let prose = without_code_spans(&without_fences(text));
    let line_of = |at: usize| prose[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    for (at, _) in prose.match_indices("](") {
        let start = at + 2;
        let Some(len) = prose[start..].find(')') else { continue };
        let inner = prose[start..start + len].trim();
        let target = inner.split_whitespace().next().unwrap_or("");
        found.push((
            line_of(at),
            target.trim_start_matches('<').trim_end_matches('>').to_string(),
        ));
    }
    let mut offset = 0;
    for line in prose.split_inclusive('\n') {
        let t = line.trim_start();
        if t.starts_with('[')
            && let Some(close) = t.find("]:")
            && !t[1..close].is_empty()
        {
            let target = t[close + 2..].split_whitespace().next().unwrap_or("");
            found.push((
                line_of(offset),
                target.trim_start_matches('<').trim_end_matches('>').to_string(),
            ));
        }
        offset += line.len();
    }
    found
}

/// Every broken relative link under `root`, as `file:line: target: why`.
fn broken_links(root: &Path) -> Vec<String> {
    let mut broken = Vec::new();
    for file in markdown_files(root) {
        let text = std::fs::read_to_string(&file).unwrap();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        for (line, target) in links(&text) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let mut why = |reason: String| broken.push(format!("{name}:{line}: ({target}): {reason}"));
            if target.is_empty() {
                why("empty link".into());
                continue;
            }
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let dest = if path.is_empty() {
                file.clone()
            } else {
                file.parent().unwrap().join(path)
            };
            if !dest.exists() {
                why("no such file".into());
                continue;
            }
            let Some(anchor) = anchor else { continue };
            if dest.extension().is_none_or(|e| e != "md") {
                why("an anchor into a file that is not Markdown cannot be checked".into());
                continue;
            }
            let headings = anchors(&std::fs::read_to_string(&dest).unwrap());
            if !headings.contains(anchor) {
                why(format!("no heading has the anchor #{anchor}"));
            }
        }
    }
    broken
}

#[test]
fn docs_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let files = markdown_files(root);
    assert!(
        files.iter().any(|f| f.ends_with("README.md")) && files.iter().any(|f| f.ends_with("docs/api.md")),
        "the check found no README.md or docs/api.md: {files:?}"
    );
    let broken = broken_links(root);
    assert!(broken.is_empty(), "broken links in the docs:\n{}", broken.join("\n"));
}

#[test]
fn docs_slugs_follow_github() {
    assert_eq!(slug("Barriers, locks and elections"), "barriers-locks-and-elections");
    assert_eq!(
        slug("The contract and generating a client"),
        "the-contract-and-generating-a-client"
    );
    assert_eq!(slug("`muster bench` and G1–G12"), "muster-bench-and-g1g12");
    assert_eq!(slug("snake_case and kebab-case"), "snake_case-and-kebab-case");
    let text = "# Nodes\n\n```md\n# Not a heading\n```\n\n## Nodes\n### [Linked](x.md) title ##\n";
    let want: HashSet<String> = ["nodes", "nodes-1", "linked-title"].map(String::from).into();
    assert_eq!(anchors(text), want);
}

/// The check itself: each kind of broken link is reported, and what is not
/// a link (code, external addresses) is left alone.
#[test]
fn docs_check_reports_broken_links() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("docs")).unwrap();
    std::fs::write(dir.path().join("docs/a.md"), "# A\n\n## Has a heading\n").unwrap();
    let readme = "\
# Top

[fine](docs/a.md#has-a-heading) [fine](#top) [fine](https://example.com/x#y)
[missing file](docs/b.md)
[missing
anchor](docs/a.md#nope)
[same file](#nowhere)
`[code](nowhere.md)`

```sh
[fenced](nowhere.md)
```

[ref]: docs/c.md
";
    std::fs::write(dir.path().join("README.md"), readme).unwrap();
    let broken = broken_links(dir.path());
    let lines: Vec<&str> = broken.iter().map(|b| b.split(": ").next().unwrap()).collect();
    assert_eq!(
        lines,
        ["README.md:4", "README.md:6", "README.md:7", "README.md:14"],
        "{broken:#?}"
    );
}
