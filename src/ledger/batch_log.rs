//! The batch log: the ledger's own write-ahead log of the batches buffered since the last commit
//! (with [`Durability::Wal`](super::Durability::Wal) and
//! [`Durability::SyncWal`](super::Durability::SyncWal)), and the [`LoggedBatch`] it holds.

use std::path::{Path, PathBuf};

use super::error::{io_error, Result};
use crate::identity::{ContentDigest, LedgerKey, CONTENT_DIGEST_BYTES, LEDGER_KEY_BYTES};
use crate::Partition;

/// A checked batch as the buffer and the batch log hold it: its new ids with their event times
/// and digests.
pub(super) struct LoggedBatch {
    pub(super) partition: Partition,
    /// Base the active generation takes if this batch is its first.
    pub(super) base_ms: i64,
    pub(super) new_ids: Vec<(LedgerKey, i64, Option<ContentDigest>)>,
    pub(super) progress: Vec<u8>,
}

/// The ledger's own write-ahead log of buffered batches: `batches-<commit seq>.log` holds the
/// batches that commit will ingest. Records are `[payload length u32 LE][XXH3-64 of the payload
/// u64 LE][payload]`; a torn or corrupt record ends the log, so what replays is a prefix.
pub(super) struct BatchLog {
    file: std::fs::File,
    pub(super) path: PathBuf,
    buf: Vec<u8>,
}

pub(super) const LOG_FILE_PREFIX: &str = "batches-";
const LOG_FILE_EXTENSION: &str = "log";
const LOG_RECORD_HEADER: usize = 12;
/// Bytes per new id in a record: key, event time, digest.
const ID_BYTES: usize = LEDGER_KEY_BYTES + 8 + CONTENT_DIGEST_BYTES;
/// The same in a record written by format version 2 (no digest).
const V2_ID_BYTES: usize = LEDGER_KEY_BYTES + 8;

pub(super) fn log_path(dir: &Path, seq: u64) -> PathBuf {
    dir.join(format!("{LOG_FILE_PREFIX}{seq:012}.{LOG_FILE_EXTENSION}"))
}

/// The commit sequence number of the batch log at `path`; `None` if it is not a batch log.
pub(super) fn log_seq(path: &Path) -> Option<u64> {
    path.file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| n.strip_prefix(LOG_FILE_PREFIX))
        .and_then(|n| n.strip_suffix(LOG_FILE_EXTENSION))
        .and_then(|n| n.strip_suffix('.'))
        .and_then(|n| n.parse::<u64>().ok())
}

impl BatchLog {
    /// Opens (creating it if needed) the log of commit `seq`, keeping its first `len` bytes.
    pub(super) fn open(dir: &Path, seq: u64, len: u64) -> Result<BatchLog> {
        let path = log_path(dir, seq);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io_error("open", &path))?;
        file.set_len(len).map_err(io_error("truncate", &path))?;
        let mut log = BatchLog {
            file,
            path,
            buf: Vec::new(),
        };
        std::io::Seek::seek(&mut log.file, std::io::SeekFrom::Start(len))
            .map_err(io_error("seek in", &log.path))?;
        Ok(log)
    }

    pub(super) fn append(&mut self, batch: &LoggedBatch, sync: bool) -> Result<()> {
        let buf = &mut self.buf;
        buf.clear();
        buf.resize(LOG_RECORD_HEADER, 0);
        buf.extend_from_slice(&batch.partition.to_le_bytes());
        buf.extend_from_slice(&batch.base_ms.to_le_bytes());
        buf.extend_from_slice(&(batch.progress.len() as u32).to_le_bytes());
        buf.extend_from_slice(&batch.progress);
        buf.extend_from_slice(&(batch.new_ids.len() as u32).to_le_bytes());
        for (key, time_ms, digest) in &batch.new_ids {
            buf.extend_from_slice(&key.0);
            buf.extend_from_slice(&time_ms.to_le_bytes());
            buf.extend_from_slice(
                &digest.map_or([0; CONTENT_DIGEST_BYTES], ContentDigest::to_bytes),
            );
        }
        let payload_len = (buf.len() - LOG_RECORD_HEADER) as u32;
        let checksum = xxhash_rust::xxh3::xxh3_64(&buf[LOG_RECORD_HEADER..]);
        buf[..4].copy_from_slice(&payload_len.to_le_bytes());
        buf[4..LOG_RECORD_HEADER].copy_from_slice(&checksum.to_le_bytes());
        std::io::Write::write_all(&mut self.file, buf)
            .map_err(io_error("append to", &self.path))?;
        if sync {
            self.file
                .sync_data()
                .map_err(io_error("sync", &self.path))?;
        }
        Ok(())
    }

    /// The batches of a log, up to the first torn or corrupt record, and the length they take.
    pub(super) fn read(path: &Path) -> Result<(Vec<LoggedBatch>, u64)> {
        let bytes = std::fs::read(path).map_err(io_error("read", path))?;
        let mut batches = Vec::new();
        let mut at = 0usize;
        while let Some(header) = bytes.get(at..at + LOG_RECORD_HEADER) {
            let len = u32::from_le_bytes(header[..4].try_into().unwrap_or_default()) as usize;
            let checksum = u64::from_le_bytes(header[4..].try_into().unwrap_or_default());
            let Some(payload) = bytes.get(at + LOG_RECORD_HEADER..at + LOG_RECORD_HEADER + len)
            else {
                break;
            };
            if xxhash_rust::xxh3::xxh3_64(payload) != checksum {
                break;
            }
            let Some(batch) = Self::parse(payload) else {
                break;
            };
            batches.push(batch);
            at += LOG_RECORD_HEADER + len;
        }
        Ok((batches, at as u64))
    }

    fn parse(payload: &[u8]) -> Option<LoggedBatch> {
        let mut rest = payload;
        let mut take = |n: usize| -> Option<&[u8]> {
            let (head, tail) = (rest.get(..n)?, rest.get(n..)?);
            rest = tail;
            Some(head)
        };
        let partition = Partition::from_le_bytes(take(4)?.try_into().ok()?);
        let base_ms = i64::from_le_bytes(take(8)?.try_into().ok()?);
        let progress_len = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        let progress = take(progress_len)?.to_vec();
        let count = u32::from_le_bytes(take(4)?.try_into().ok()?) as usize;
        // A record written by format version 2 has no digests: what is left says which it is.
        let left = payload.len() - (4 + 8 + 4 + progress_len + 4);
        let with_digests = match left {
            n if n == count * ID_BYTES => true,
            n if n == count * V2_ID_BYTES => false,
            _ => return None,
        };
        let mut new_ids = Vec::with_capacity(count);
        for _ in 0..count {
            let key = LedgerKey(take(LEDGER_KEY_BYTES)?.try_into().ok()?);
            let time_ms = i64::from_le_bytes(take(8)?.try_into().ok()?);
            let digest = match with_digests {
                true => ContentDigest::from_bytes(take(CONTENT_DIGEST_BYTES)?.try_into().ok()?),
                false => None,
            };
            new_ids.push((key, time_ms, digest));
        }
        Some(LoggedBatch {
            partition,
            base_ms,
            new_ids,
            progress,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::ledger_key;

    fn batch(n: u64, ids: u64) -> LoggedBatch {
        LoggedBatch {
            partition: n as Partition,
            base_ms: n as i64 * 1000,
            new_ids: (0..ids)
                .map(|i| {
                    let digest = (i % 2 == 0).then(|| ContentDigest::of_hash(i << 48));
                    (
                        ledger_key(format!("log-{n}-{i}").as_bytes()).unwrap(),
                        (n * 1000 + i) as i64,
                        digest,
                    )
                })
                .collect(),
            progress: n.to_le_bytes().to_vec(),
        }
    }

    fn assert_same(read: &[LoggedBatch], written: &[LoggedBatch]) {
        assert_eq!(read.len(), written.len());
        for (r, w) in read.iter().zip(written) {
            assert_eq!(
                (r.partition, r.base_ms, &r.progress),
                (w.partition, w.base_ms, &w.progress)
            );
            assert!(
                r.new_ids == w.new_ids,
                "the ids of batch {} differ",
                w.partition
            );
        }
    }

    /// Writes `batches` to a new log of commit 1 and returns its path and each record's end.
    fn write_log(dir: &Path, batches: &[LoggedBatch]) -> (PathBuf, Vec<u64>) {
        let mut log = BatchLog::open(dir, 1, 0).unwrap();
        let mut ends = Vec::new();
        for b in batches {
            log.append(b, false).unwrap();
            ends.push(std::fs::metadata(&log.path).unwrap().len());
        }
        (log.path.clone(), ends)
    }

    #[test]
    fn appended_batches_read_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        // A batch of only progress (no new ids) is logged too.
        let batches = [batch(1, 3), batch(2, 0), batch(3, 100)];
        let (path, ends) = write_log(dir.path(), &batches);
        assert_eq!(path, log_path(dir.path(), 1));
        assert_eq!(log_seq(&path), Some(1));
        let (read, valid) = BatchLog::read(&path).unwrap();
        assert_same(&read, &batches);
        assert_eq!(valid, ends[2]);
    }

    #[test]
    fn a_torn_tail_ends_the_log_at_the_last_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let batches = [batch(1, 5), batch(2, 5), batch(3, 5)];
        let (path, ends) = write_log(dir.path(), &batches);
        let whole = std::fs::read(&path).unwrap();
        // Cut anywhere inside the third record, its header included.
        for cut in ends[1]..ends[2] {
            std::fs::write(&path, &whole[..cut as usize]).unwrap();
            let (read, valid) = BatchLog::read(&path).unwrap();
            assert_same(&read, &batches[..2]);
            assert_eq!(valid, ends[1], "cut at {cut}");
        }
    }

    #[test]
    fn a_corrupt_record_ends_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let batches = [batch(1, 5), batch(2, 5), batch(3, 5)];
        let (path, ends) = write_log(dir.path(), &batches);
        let mut bytes = std::fs::read(&path).unwrap();
        // A flipped bit in the second record's payload: its checksum no longer matches, and the
        // third record, whole as it is, must not be replayed after a lost one.
        bytes[ends[0] as usize + LOG_RECORD_HEADER + 2] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let (read, valid) = BatchLog::read(&path).unwrap();
        assert_same(&read, &batches[..1]);
        assert_eq!(valid, ends[0]);
    }

    #[test]
    fn reopening_drops_a_torn_tail_and_appends_after_the_good_part() {
        let dir = tempfile::tempdir().unwrap();
        let batches = [batch(1, 5), batch(2, 5)];
        let (path, ends) = write_log(dir.path(), &batches);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes.extend_from_slice(&[200, 0, 0, 0, 1, 2, 3]);
        std::fs::write(&path, &bytes).unwrap();
        let (_, valid) = BatchLog::read(&path).unwrap();
        assert_eq!(valid, ends[1]);
        let mut log = BatchLog::open(dir.path(), 1, valid).unwrap();
        let third = batch(3, 2);
        log.append(&third, true).unwrap();
        let (read, _) = BatchLog::read(&path).unwrap();
        assert_same(&read, &[batch(1, 5), batch(2, 5), third]);
    }

    #[test]
    fn a_log_written_before_digests_reads_back_without_them() {
        // Format version 2's records: per id its key and time, no digest.
        let dir = tempfile::tempdir().unwrap();
        let path = log_path(dir.path(), 1);
        let written = batch(7, 3);
        let mut payload = Vec::new();
        payload.extend_from_slice(&written.partition.to_le_bytes());
        payload.extend_from_slice(&written.base_ms.to_le_bytes());
        payload.extend_from_slice(&(written.progress.len() as u32).to_le_bytes());
        payload.extend_from_slice(&written.progress);
        payload.extend_from_slice(&3u32.to_le_bytes());
        for (key, time_ms, _) in &written.new_ids {
            payload.extend_from_slice(&key.0);
            payload.extend_from_slice(&time_ms.to_le_bytes());
        }
        let mut record = (payload.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&payload).to_le_bytes());
        record.extend_from_slice(&payload);
        std::fs::write(&path, &record).unwrap();
        let (read, valid) = BatchLog::read(&path).unwrap();
        assert_eq!(valid, record.len() as u64);
        let ids: Vec<_> = read[0]
            .new_ids
            .iter()
            .map(|(k, t, d)| (*k, *t, *d))
            .collect();
        let expected: Vec<_> = written
            .new_ids
            .iter()
            .map(|(k, t, _)| (*k, *t, None))
            .collect();
        assert_eq!(ids, expected);
        // A record whose length fits neither layout is corrupt.
        let mut bad = payload.clone();
        bad.push(0);
        let mut record = (bad.len() as u32).to_le_bytes().to_vec();
        record.extend_from_slice(&xxhash_rust::xxh3::xxh3_64(&bad).to_le_bytes());
        record.extend_from_slice(&bad);
        std::fs::write(&path, &record).unwrap();
        assert_eq!(BatchLog::read(&path).unwrap().0.len(), 0);
    }

    #[test]
    fn only_batch_logs_have_a_sequence_number() {
        let dir = Path::new("/ledger");
        assert_eq!(log_seq(&log_path(dir, 42)), Some(42));
        let others = [
            "batches-000000000042.ingest",
            "commit-000000000042.ingest",
            "batches-x.log",
            "000042.log",
            "CURRENT",
        ];
        for name in others {
            assert_eq!(log_seq(&dir.join(name)), None, "{name}");
        }
    }
}
