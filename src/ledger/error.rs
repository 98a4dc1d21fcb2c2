//! The ledger's errors: [`LedgerError`], the [`Result`] of the ledger layer, and the one place
//! RocksDB and file-system errors are converted into them.

use std::path::{Path, PathBuf};

use super::{FORMAT_VERSION, OLDEST_READABLE_FORMAT_VERSION};

/// Errors of the ledger layer. RocksDB errors are converted in [`rocks`].
#[derive(Debug, thiserror::Error)]
pub enum LedgerError {
    /// Opening (or creating) the ledger at `path` failed; nothing was deleted.
    #[error("cannot open the ledger at {path}: {source}")]
    Open {
        /// The ledger directory.
        path: PathBuf,
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// The directory exists, is not empty and does not look like a ledger; it was left alone.
    #[error("{path} is not a ledger: {reason}; it was left untouched")]
    NotALedger {
        /// The directory.
        path: PathBuf,
        /// What is missing.
        reason: String,
    },
    /// A file-system operation outside RocksDB failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path concerned.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// Writing a batch (or metadata) failed.
    #[error("cannot write to the ledger: {source}")]
    Write {
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Reading the ledger failed.
    #[error("cannot read the ledger: {source}")]
    Read {
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Creating or dropping a generation failed.
    #[error("cannot {what} generation {name}: {source}")]
    Generation {
        /// "create" or "drop".
        what: &'static str,
        /// Column family name.
        name: String,
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Creating a checkpoint in `dir` failed.
    #[error("cannot create a ledger checkpoint in {dir}: {source}")]
    Checkpoint {
        /// Checkpoint directory.
        dir: PathBuf,
        /// RocksDB's reason.
        source: rocksdb::Error,
    },
    /// Restoring into a non-empty directory without being told to replace it.
    #[error("refusing to restore into {dir}: it is not empty")]
    TargetNotEmpty {
        /// The target directory.
        dir: PathBuf,
    },
    /// The metadata column family holds something this code cannot interpret.
    #[error("corrupt ledger metadata: {what}")]
    CorruptMetadata {
        /// What is wrong.
        what: String,
    },
    /// A thread of the ledger's own (a commit's file writer, a load's run writer) panicked: a
    /// bug, not damage on disk. What it was writing is written again by the next call (a
    /// commit) or the next attempt (a load); nothing it wrote was ingested.
    #[error("the ledger's {thread} thread panicked ({message}): a bug in this build, not a damaged ledger; what it was writing is written again by the next attempt")]
    Panicked {
        /// Which thread.
        thread: &'static str,
        /// The panic's message.
        message: String,
    },
    /// The ledger was written in a format version this code does not know.
    #[error("the ledger has format version {found}; this build ({}) reads versions {OLDEST_READABLE_FORMAT_VERSION} to {FORMAT_VERSION}, so a newer release wrote it: start that release again, or move the ledger directory aside and start this one on an empty directory (it loads the ids from the changelog); no id was written to it (docs/upgrading.md, Rolling back)", crate::VERSION)]
    UnknownFormat {
        /// Version found on disk.
        found: u32,
    },
}

impl LedgerError {
    /// Whether retrying the same call may succeed (transient I/O trouble), as opposed to a state
    /// that needs an operator (corruption, unknown format, misuse).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LedgerError::Write { .. }
                | LedgerError::Read { .. }
                | LedgerError::Checkpoint { .. }
                | LedgerError::Panicked { .. }
        )
    }

    /// The error of a ledger thread that panicked with `payload` (what `JoinHandle::join`
    /// returns).
    pub(super) fn panicked(thread: &'static str, payload: &(dyn std::any::Any + Send)) -> Self {
        let message = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "no message".to_string());
        LedgerError::Panicked { thread, message }
    }
}

/// Result of the ledger layer.
pub type Result<T, E = LedgerError> = std::result::Result<T, E>;

/// What was being done when RocksDB failed: the one place RocksDB errors are converted.
pub(super) enum Doing<'a> {
    Write,
    Read,
    Open(&'a Path),
    Checkpoint(&'a Path),
    Generation(&'static str, &'a str),
}

pub(super) fn rocks(doing: Doing<'_>) -> impl FnOnce(rocksdb::Error) -> LedgerError + '_ {
    move |source| match doing {
        Doing::Write => LedgerError::Write { source },
        Doing::Read => LedgerError::Read { source },
        Doing::Open(path) => LedgerError::Open {
            path: path.to_path_buf(),
            source,
        },
        Doing::Checkpoint(dir) => LedgerError::Checkpoint {
            dir: dir.to_path_buf(),
            source,
        },
        Doing::Generation(what, name) => LedgerError::Generation {
            what,
            name: name.to_string(),
            source,
        },
    }
}

pub(super) fn io_error<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> LedgerError + 'a {
    move |source| LedgerError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}
