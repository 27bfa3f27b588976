//! `org/name[@revision][:quant]`: a Hugging Face model repo, the revision
//! (branch, tag or commit; `main` by default) and, for a repo of GGUF
//! files, which one (llama.cpp's `-hf org/name:Q4_K_M`).

/// The hub refuses longer repo names.
const MAX_PART: usize = 96;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubName {
    /// `org/name`.
    pub repo: String,
    pub revision: String,
    /// Part of the name of the GGUF file to take.
    pub quant: Option<String>,
}

impl HubName {
    /// The name `spec` spells, or `None` if it is not one.
    pub fn parse(spec: &str) -> Option<Self> {
        let (rest, quant) = match spec.split_once(':') {
            Some((rest, quant)) => (rest, Some(quant)),
            None => (spec, None),
        };
        let (repo, revision) = match rest.split_once('@') {
            Some((repo, revision)) => (repo, revision),
            None => (rest, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        if !is_repo_part(org) || !is_repo_part(name) || !is_revision(revision) {
            return None;
        }
        if quant.is_some_and(|q| q.is_empty() || !q.chars().all(is_name_char)) {
            return None;
        }
        Some(HubName {
            repo: repo.to_string(),
            revision: revision.to_string(),
            quant: quant.map(str::to_string),
        })
    }
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "._-".contains(c)
}

/// An organisation or model name as the hub allows it.
fn is_repo_part(part: &str) -> bool {
    let edge = |c: char| c == '.' || c == '-';
    !part.is_empty()
        && part.len() <= MAX_PART
        && part.chars().all(is_name_char)
        && !part.starts_with(edge)
        && !part.ends_with(edge)
        && !part.contains("--")
        && !part.contains("..")
}

/// A branch, tag or commit: git's ref characters, with nothing that could
/// leave the cache's `refs/` folder.
fn is_revision(revision: &str) -> bool {
    !revision.is_empty()
        && revision.len() <= 255
        && revision.chars().all(|c| is_name_char(c) || c == '/')
        && revision
            .split('/')
            .all(|part| !part.is_empty() && !part.starts_with('.'))
}

/// Whether `revision` is a full commit hash, which names a snapshot
/// folder directly.
pub fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repo_name_takes_main_and_no_quant_by_default() {
        let name = HubName::parse("org/model-1.5B").unwrap();
        assert_eq!(
            (name.repo.as_str(), name.revision.as_str(), name.quant),
            ("org/model-1.5B", "main", None)
        );
    }

    #[test]
    fn revision_and_quant_are_read_after_the_repo() {
        let name = HubName::parse("org/model-GGUF@v1.0:Q4_K_M").unwrap();
        assert_eq!(name.repo, "org/model-GGUF");
        assert_eq!(name.revision, "v1.0");
        assert_eq!(name.quant.as_deref(), Some("Q4_K_M"));
        assert_eq!(HubName::parse("org/m@refs/pr/1").unwrap().revision, "refs/pr/1");
    }

    #[test]
    fn paths_and_malformed_names_are_not_repo_names() {
        for spec in [
            "model",
            "./org/model",
            "a/b/c",
            "/abs/path",
            "org/",
            "org/..",
            "org/-x",
            "org/a--b",
            "org/m@",
            "org/m@../x",
            "org/m@a//b",
            "org/m:",
            "org/m:a/b",
            "C:\\models\\x",
        ] {
            assert_eq!(HubName::parse(spec), None, "{spec}");
        }
    }

    #[test]
    fn commits_are_40_lowercase_hex_digits() {
        assert!(is_commit(&"a".repeat(40)));
        assert!(!is_commit(&"A".repeat(40)));
        assert!(!is_commit("main"));
    }
}
