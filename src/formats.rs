//! What this build writes and reads, format by format: what `dedupe --version` prints and
//! `dedupe_build_info` labels, so a fleet of mixed versions shows on a dashboard, and what the
//! past releases' fixtures (`cli/tests/past_formats.rs`) hold each release to. Which release
//! writes which is in docs/releases.md; what to do about it is in docs/upgrading.md.

use std::fmt::Write;

use crate::{audit, changelog, ledger, wire};

pub use crate::VERSION;

/// One format: the version this build writes and the versions it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Format {
    pub name: &'static str,
    pub writes: String,
    pub reads: String,
}

/// Every format this build writes or reads, in the order `dedupe --version` prints them.
pub fn all() -> Vec<Format> {
    let headers = [
        wire::HEADER_SOURCE,
        wire::HEADER_MESSAGE_ID,
        wire::HEADER_CONTENT_DIGEST,
        wire::HEADER_REASON,
        wire::HEADER_ERROR,
        wire::HEADER_RECEIVED_AT,
        wire::HEADER_ENDPOINT,
        wire::HEADER_INDEX,
    ];
    vec![
        Format {
            name: "ledger",
            writes: format!(
                "{} ({} without a retention limit)",
                ledger::FORMAT_VERSION,
                ledger::SECONDS_FORMAT_VERSION
            ),
            reads: format!(
                "{} to {}",
                ledger::OLDEST_READABLE_FORMAT_VERSION,
                ledger::FORMAT_VERSION
            ),
        },
        Format {
            name: "id index",
            writes: ledger::INDEX_FILE_VERSION.to_string(),
            reads: format!(
                "{} (another is rebuilt from the ledger)",
                ledger::INDEX_FILE_VERSION
            ),
        },
        Format {
            name: "snapshot",
            writes: "the ledger's (a checkpoint of it)".to_string(),
            reads: "the ledger's".to_string(),
        },
        Format {
            name: "id changelog record kinds",
            writes: format!(
                "{} ids, {} forgotten, {} resent",
                changelog::VERSION,
                changelog::FORGOTTEN,
                changelog::RESENT
            ),
            reads: format!("{} to {}", changelog::VERSION, changelog::RESENT),
        },
        Format {
            name: "audit record",
            writes: format!(
                "{} (duplicates, forget, dead_letter)",
                audit::FORMAT_VERSION
            ),
            reads: "none (written only)".to_string(),
        },
        Format {
            name: "front door headers",
            writes: headers.join(" "),
            reads: format!("{} {}", wire::HEADER_SOURCE, wire::HEADER_CONTENT_DIGEST),
        },
    ]
}

/// `dedupe --version`'s text: the version, the commit, then one line per format.
pub fn version_text(commit: &str) -> String {
    let mut text = format!("{VERSION} (commit {commit})\n");
    for f in all() {
        // Writing to a String cannot fail.
        let _ = writeln!(text, "  {}: writes {}; reads {}", f.name, f.writes, f.reads);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_text_names_each_format_with_the_versions_the_code_uses() {
        let text = version_text("abc");
        assert!(text.starts_with(&format!("{VERSION} (commit abc)\n")));
        assert!(text.contains(&format!(
            "ledger: writes {} (3 without a retention limit); reads 1 to {}",
            ledger::FORMAT_VERSION,
            ledger::FORMAT_VERSION
        )));
        assert!(text.contains("id changelog record kinds: writes 1 ids, 2 forgotten, 3 resent"));
        assert!(text.contains(wire::HEADER_CONTENT_DIGEST));
        assert_eq!(text.lines().count(), 1 + all().len());
    }
}
