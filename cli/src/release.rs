//! This binary's release: its version and the commit it was built from (`build.rs`), and with
//! `--version` the formats it writes and reads (`dedupe::formats`).

use std::sync::OnceLock;

/// The commit the binary was built from, 12 digits, or `unknown`.
pub const COMMIT: &str = env!("DEDUPE_COMMIT");

/// `dedupe -V`: the version and the commit.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("DEDUPE_COMMIT"),
    ")"
);

/// `dedupe --version`: the version, the commit, and one line per format.
pub fn long_version() -> &'static str {
    static TEXT: OnceLock<String> = OnceLock::new();
    TEXT.get_or_init(|| dedupe::formats::version_text(COMMIT).trim_end().to_string())
}
