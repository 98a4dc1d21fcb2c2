//! What the bench's stores take: the files under a directory, and the process's peak memory.

use std::path::Path;

use crate::ledger::INDEX_FILE;

/// Peak resident set size of this process (VmHWM).
pub fn peak_rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// What the files under `path` take, recursively.
pub(super) fn dir_bytes(path: &Path) -> DiskUse {
    let mut used = DiskUse::default();
    let Ok(entries) = std::fs::read_dir(path) else {
        return used;
    };
    for entry in entries.filter_map(|e| e.ok()) {
        match entry.metadata() {
            Ok(m) if m.is_dir() => {
                let below = dir_bytes(&entry.path());
                used.all += below.all;
                used.index_files += below.index_files;
            }
            Ok(m) => {
                used.all += m.len();
                if entry.file_name().to_string_lossy().starts_with(INDEX_FILE) {
                    used.index_files += m.len();
                }
            }
            Err(_) => {}
        }
    }
    used
}

/// Bytes under a directory: everything, and the id index's files among them (the stored file and
/// any being written).
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct DiskUse {
    pub(super) all: u64,
    pub(super) index_files: u64,
}

impl DiskUse {
    /// The larger of each figure: what two samples of one directory peaked at.
    pub(super) fn peak(self, other: Self) -> Self {
        Self {
            all: self.all.max(other.all),
            index_files: self.index_files.max(other.index_files),
        }
    }
}
