//! The id index on disk: written when the ledger closes and after every seal, carried by every
//! checkpoint, read when it opens, so that opening does not read every id again.
//!
//! # File `id-index` (in the ledger directory, beside RocksDB's files)
//! `[magic 8][header length u32 LE][header][XXH3-64 of the header, u64 LE][zeros to the next
//! multiple of 4096][table][table checksum, u64 LE]`. The table starts aligned, so it is read in
//! parallel pieces straight into memory; its checksum is the XXH3-64 of the XXH3-64s (u64 LE) of
//! its 8 MiB pieces in order, so each reader hashes what it read. The header holds the file
//! version, the table's seed, its sizes (buckets at level 0, the full size's level) and its
//! level, the overflowed buckets, the slots held per tag and the level each tag's entries were
//! stored at, the ledger's `commit_seq` when it was written, and every live generation's id with
//! whether it was sealed then. The table is the index's buckets as they are in memory, at its
//! current size: the file grows with the ids held. A file of version 2 (a table at full size
//! from the start) is of another version: the first open after the upgrade rebuilds the index.
//!
//! # When it is trusted
//! Ids reach a generation only through commits, and a sealed generation never changes. So, for a
//! ledger whose state is `commit_seq` S with generations G, a file written at S' with generations
//! G' vouches for:
//! - every generation that was sealed in G' and is still in G (a sealed generation is final);
//! - every generation of G' when S' = S (nothing was committed since the file was written).
//!
//! The others (the generation that was active when the file was written, and any generation
//! started since) are read from disk, as a full rebuild would; their tags are cleared first.
//! Generations of G' that are gone (forgotten) stay dead. A file of another size or version, one
//! whose checksums fail, a truncated one, or a missing one means a full rebuild; each case is
//! logged with its cause. A file never answers for ids it does not hold: whatever it does not
//! vouch for is read from RocksDB.
//!
//! The file is replaced atomically (written under a temporary name, synced, renamed), so a crash
//! while it is written leaves the previous file or none. Temporary files a crash left are removed
//! when the ledger opens.
//!
//! # Stored in the background after a seal
//! At a billion ids the table is 5 GB, and writing it under the ledger's lock stopped every
//! partition for 3-5 s once per generation. After a seal (everything committed, the new active
//! generation empty, at `commit_seq` S) a thread copies the table out one 8 MiB piece at a time,
//! taking the lock only for each copy, and writes it with a stamp of S that names only the sealed
//! generations. Meanwhile new ids go into the active generation, so the file holds some of them;
//! the stamp does not name that generation, so an open clears its slots and reads it from disk
//! (usually the smallest). The slots of the sealed generations, which the stamp vouches for, do
//! not change while the store runs: inserts only take free or dead slots, and anything that clears
//! or forgets slots (the next seal, a close, a checkpoint's own write) bumps the ledger's index
//! epoch first, which makes the store give up.
//! The header, written last, holds the slot counts at the end, so the active generation's slots are
//! cleared when the file is loaded. A piece copied before a dead slot was reused can still show the
//! dead generation's fingerprint under a tag that is later reused: that is a false "maybe", which
//! RocksDB answers; no slot the file vouches for is ever missing.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;

use xxhash_rust::xxh3::xxh3_64;

use super::direct_io::{align_up, read_pieces, table_pieces, DirectWriter, CHUNK};
use super::error::io_error;
use super::index::{Geometry, Header, IdIndex};
use super::{Result, State};
use crate::metrics::events::{
    IdIndexNotStored, IdIndexStored, IndexStore, StoredIndex, StoredIndexNotUsed,
};

/// The index file's name in a ledger (or checkpoint) directory.
pub const INDEX_FILE: &str = "id-index";
const TEMPORARY: &str = "id-index.partial";
/// The temporary name of a file being stored in the background, before its epoch (two stores
/// overlap when one gives up while the next starts).
const STORING: &str = "id-index.storing.";
const MAGIC: &[u8; 8] = b"DDUPIDX\x01";
/// The index file's version: a file of another version is rebuilt from the ledger at open.
pub const VERSION: u32 = 3;
/// Longest header accepted (256 tag counts, generations: far below this).
const MAX_HEADER: u32 = 1 << 20;

/// How the id index came to be when the ledger opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexSource {
    /// There was nothing to index (a new ledger), or the ledger is opened without an index.
    Empty,
    /// Loaded from the index file; nothing read from the generations.
    Loaded,
    /// Loaded from the index file; the generations it could not vouch for were read from disk.
    Partial,
    /// Rebuilt from every generation (no usable index file).
    Rebuilt,
}

impl IndexSource {
    /// The label used in metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            IndexSource::Empty => "empty",
            IndexSource::Loaded => "loaded",
            IndexSource::Partial => "partial",
            IndexSource::Rebuilt => "rebuilt",
        }
    }
}

/// What a file's header says beside the index's own header.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    commit_seq: u64,
    /// Generation id → sealed, when the file was written.
    generations: BTreeMap<u64, bool>,
}

/// A stored index read back, and what it vouches for.
pub(super) struct Loaded {
    pub(super) index: IdIndex,
    /// Generations whose ids the table holds completely.
    pub(super) trusted: Vec<u64>,
}

/// Writes `state`'s index into `dir` (replacing any file there). Nothing is written for an index
/// that knows nothing. The caller has committed everything buffered: the table then holds exactly
/// the ids of the generations at `state.commit_seq`. With `durable`, the file and the rename are
/// synced; without, a power loss may leave a torn file, which its checksums turn away.
pub(super) fn write(dir: &Path, state: &State, durable: bool) -> Result<()> {
    if !state.index.knows() {
        return Ok(());
    }
    if state.index.live_slots() == 0 {
        // Nothing to vouch for, and nothing to read back: an index that holds no id is not
        // stored (rebuilding it costs nothing), and one stored before goes, so that no file
        // outlives what it describes.
        let target = dir.join(INDEX_FILE);
        if target.exists() {
            std::fs::remove_file(&target).map_err(io_error("remove", &target))?;
            if durable {
                std::fs::File::open(dir)
                    .and_then(|d| d.sync_all())
                    .map_err(io_error("sync", dir))?;
            }
        }
        return Ok(());
    }
    let stamp = Stamp {
        commit_seq: state.commit_seq,
        generations: state
            .generations
            .iter()
            .map(|g| (g.meta.id, g.meta.sealed))
            .collect(),
    };
    let header = encode_header(&state.index.header(), &stamp);
    let temporary = dir.join(TEMPORARY);
    let written = (|| -> std::io::Result<()> {
        let mut file = DirectWriter::create(&temporary)?;
        file.write_all(&head(&header))?;
        let table = state.index.table();
        let mut digests = Vec::with_capacity(table_pieces(table.len()) * 8);
        for chunk in table.chunks(CHUNK) {
            digests.extend_from_slice(&xxh3_64(chunk).to_le_bytes());
            file.write_all(chunk)?;
        }
        file.write_all(&xxh3_64(&digests).to_le_bytes())?;
        file.finish(durable)
    })();
    written.map_err(io_error("write", &temporary))?;
    let target = dir.join(INDEX_FILE);
    std::fs::rename(&temporary, &target).map_err(io_error("rename into place", &target))?;
    if durable {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error("sync", dir))?;
    }
    Ok(())
}

/// Stores `state`'s index into `dir` from a background thread, as described in the module
/// documentation, unless the ledger's index epoch moves on from `epoch` first. Logs the outcome;
/// a failure or a give-up only leaves the previous file in place.
pub(super) fn store_in_background(state: &Mutex<State>, dir: &Path, epoch: u64) {
    let started = std::time::Instant::now();
    let temporary = dir.join(format!("{STORING}{epoch}"));
    match store(state, dir, &temporary, epoch) {
        Ok(true) => IdIndexStored {
            path: dir,
            elapsed_ms: started.elapsed().as_millis() as u64,
            at_close: false,
        }
        .emit(),
        Ok(false) => {
            let _ = std::fs::remove_file(&temporary);
            tracing::debug!("Gave up storing the id index: the ledger sealed, closed or checkpointed meanwhile.");
        }
        Err(e) => {
            let _ = std::fs::remove_file(&temporary);
            IdIndexNotStored {
                path: dir,
                when: IndexStore::AfterSeal,
                error: &e,
            }
            .emit();
        }
    }
}

/// The background store itself: `Ok(false)` when it gave up.
fn store(state: &Mutex<State>, dir: &Path, temporary: &Path, epoch: u64) -> std::io::Result<bool> {
    let lock = || {
        state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    };
    let (stamp, header, table_len) = {
        let state = lock();
        if state.index_epoch != epoch || !state.index.knows() {
            return Ok(false);
        }
        // Only the sealed generations: the active one takes ids while the table is copied.
        let stamp = Stamp {
            commit_seq: state.commit_seq,
            generations: state
                .generations
                .iter()
                .filter(|g| g.meta.sealed)
                .map(|g| (g.meta.id, true))
                .collect(),
        };
        let header = encode_header(&state.index.header(), &stamp);
        (stamp, header, state.index.table().len())
    };
    let mut file = DirectWriter::create(temporary)?;
    // The header's place, written again at the end with the slot counts of then.
    file.write_all(&head(&header))?;
    let mut piece = vec![0u8; CHUNK.min(table_len)];
    let mut digests = Vec::with_capacity(table_pieces(table_len) * 8);
    let mut at = 0;
    while at < table_len {
        let n = CHUNK.min(table_len - at);
        {
            let state = lock();
            if state.index_epoch != epoch {
                return Ok(false);
            }
            piece[..n].copy_from_slice(&state.index.table()[at..at + n]);
        }
        digests.extend_from_slice(&xxh3_64(&piece[..n]).to_le_bytes());
        file.write_all(&piece[..n])?;
        at += n;
    }
    file.write_all(&xxh3_64(&digests).to_le_bytes())?;
    file.finish(false)?;
    // Still under the lock for the rename: a close or checkpoint that writes the file itself
    // bumps the epoch first, so this older file never replaces theirs. (The ledger's
    // `index_stored_at` is left alone: this file does not vouch for the active generation.)
    let state = lock();
    if state.index_epoch != epoch {
        return Ok(false);
    }
    let last = encode_header(&state.index.header(), &stamp);
    if last.len() != header.len() {
        // Same stamp, same number of tags: the length cannot change. Give up rather than shift the table.
        return Ok(false);
    }
    std::fs::OpenOptions::new()
        .write(true)
        .open(temporary)?
        .write_all_at(&head(&last), 0)?;
    std::fs::rename(temporary, dir.join(INDEX_FILE))?;
    Ok(true)
}

/// Removes the temporary files that a crash while storing the index left in `dir`.
pub(super) fn remove_leftovers(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_error("read", dir))? {
        let entry = entry.map_err(io_error("read", dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == TEMPORARY || name.starts_with(STORING) {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(io_error("remove", &path))?;
            tracing::info!(path = %path.display(), "Removed an id index file left half-written by a crash.");
        }
    }
    Ok(())
}

/// Reads the index file in `dir` for a ledger at `commit_seq` with `generations` (id → sealed)
/// and a table of `geometry`'s sizes. `None` (with the cause logged) when there is no usable file.
pub(super) fn read(
    dir: &Path,
    geometry: Geometry,
    commit_seq: u64,
    generations: &BTreeMap<u64, bool>,
) -> Option<Loaded> {
    let path = dir.join(INDEX_FILE);
    let file = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            not_used(&path, StoredIndex::Missing, None);
            return None;
        }
        Err(e) => {
            not_used(&path, StoredIndex::Unopenable, Some(&e));
            return None;
        }
    };
    match read_file(&path, file, geometry) {
        Ok(Some((index, stamp))) => {
            let trusted = generations
                .keys()
                .copied()
                .filter(|id| match stamp.generations.get(id) {
                    Some(true) => true,
                    Some(false) => stamp.commit_seq == commit_seq,
                    None => false,
                })
                .collect();
            Some(Loaded { index, trusted })
        }
        Ok(None) => {
            not_used(&path, StoredIndex::OtherSize, None);
            None
        }
        Err(e) => {
            not_used(&path, StoredIndex::Unusable, Some(&e));
            None
        }
    }
}

/// Makes the index file in `dir` durable (one written unsynced after a seal).
pub(super) fn sync(dir: &Path) -> Result<()> {
    let path = dir.join(INDEX_FILE);
    std::fs::File::open(&path)
        .and_then(|f| f.sync_all())
        .map_err(io_error("sync", &path))
}

/// Makes `to`'s index file the one in `from` (a hard link, or a copy across file systems),
/// replacing it atomically. Nothing happens when `from` has none.
pub(super) fn link_into(from: &Path, to: &Path) -> Result<()> {
    let source = from.join(INDEX_FILE);
    if !source.exists() {
        return Ok(());
    }
    let temporary = to.join(TEMPORARY);
    let _ = std::fs::remove_file(&temporary);
    if std::fs::hard_link(&source, &temporary).is_err() {
        std::fs::copy(&source, &temporary).map_err(io_error("copy into", &temporary))?;
    }
    let target = to.join(INDEX_FILE);
    std::fs::rename(&temporary, &target).map_err(io_error("rename into place", &target))?;
    std::fs::File::open(to)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync", to))
}

/// The open does not use the stored index at `path`, for `why`.
fn not_used(path: &Path, why: StoredIndex, error: Option<&dyn std::fmt::Display>) {
    StoredIndexNotUsed { path, why, error }.emit();
}

fn invalid(what: impl Into<String>) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::InvalidData, what.into())
}

/// The index and stamp in `file` (at `path`); `Ok(None)` for a well-formed file of other table
/// sizes.
fn read_file(
    path: &Path,
    file: std::fs::File,
    geometry: Geometry,
) -> std::io::Result<Option<(IdIndex, Stamp)>> {
    let file_len = file.metadata()?.len();
    let mut head = std::io::BufReader::new(&file);
    let mut magic = [0u8; 8];
    head.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(invalid("not an id index file (wrong magic)"));
    }
    let len = read_u32(&mut head)?;
    if len > MAX_HEADER {
        return Err(invalid(format!("header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    head.read_exact(&mut header)?;
    if read_u64(&mut head)? != xxh3_64(&header) {
        return Err(invalid("the header's checksum does not match"));
    }
    let (index_header, stamp) = decode_header(&header)?;
    let (headed, table_start) = header_end_and_table_start(header.len());
    // The padding before the table is covered by no checksum: it must be zeros, as written.
    let mut padding = vec![0u8; table_start - headed];
    head.read_exact(&mut padding)?;
    if padding.iter().any(|&b| b != 0) {
        return Err(invalid("the padding before the table is not zeros"));
    }
    let table_start = table_start as u64;
    let mut digests = Vec::new();
    let loaded = IdIndex::from_parts(&index_header, geometry, |table| {
        let expected = table_start + table.len() as u64 + 8;
        if file_len != expected {
            return Err(invalid(format!(
                "{file_len} bytes where the table and its checksum make {expected}"
            )));
        }
        digests = read_pieces(path, table_start, table)?;
        Ok(())
    })?;
    let Some(index) = loaded else { return Ok(None) };
    let mut stored = [0u8; 8];
    file.read_exact_at(&mut stored, table_start + index.table().len() as u64)?;
    let digest_bytes: Vec<u8> = digests.iter().flat_map(|d| d.to_le_bytes()).collect();
    if u64::from_le_bytes(stored) != xxh3_64(&digest_bytes) {
        return Err(invalid("the table's checksum does not match"));
    }
    Ok(Some((index, stamp)))
}

/// What precedes the table: magic, header length, header, its checksum, zeros up to the table.
fn head(header: &[u8]) -> Vec<u8> {
    let (headed, table_start) = header_end_and_table_start(header.len());
    let mut out = Vec::with_capacity(table_start);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(&xxh3_64(header).to_le_bytes());
    debug_assert_eq!(out.len(), headed);
    out.resize(table_start, 0);
    out
}

/// Where the header section (magic, length, header, its checksum) ends, and where the table
/// starts after the zero padding, for a header of `header_len` bytes.
fn header_end_and_table_start(header_len: usize) -> (usize, usize) {
    let end = MAGIC.len() + 4 + header_len + 8;
    (end, align_up(end))
}

fn encode_header(h: &Header, stamp: &Stamp) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + 9 * h.slots_by_tag.len() + 9 * stamp.generations.len());
    out.extend_from_slice(&VERSION.to_le_bytes());
    for v in [
        h.seed,
        h.geometry.base as u64,
        h.overflowed,
        stamp.commit_seq,
    ] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out.extend_from_slice(&[h.geometry.max_level, h.level]);
    out.extend_from_slice(&(h.slots_by_tag.len() as u32).to_le_bytes());
    for (slots, level) in h.slots_by_tag.iter().zip(&h.level_of) {
        out.extend_from_slice(&slots.to_le_bytes());
        out.push(*level);
    }
    out.extend_from_slice(&(stamp.generations.len() as u32).to_le_bytes());
    for (id, sealed) in &stamp.generations {
        out.extend_from_slice(&id.to_le_bytes());
        out.push(u8::from(*sealed));
    }
    out
}

fn decode_header(bytes: &[u8]) -> std::io::Result<(Header, Stamp)> {
    let mut r = bytes;
    let version = read_u32(&mut r)?;
    if version != VERSION {
        return Err(invalid(format!(
            "file version {version}, this code reads {VERSION}"
        )));
    }
    let (seed, base, overflowed, commit_seq) = (
        read_u64(&mut r)?,
        read_u64(&mut r)?,
        read_u64(&mut r)?,
        read_u64(&mut r)?,
    );
    let [max_level, level] = read_bytes::<2>(&mut r)?;
    let tags = read_u32(&mut r)? as usize;
    if tags > 1 << 16 {
        return Err(invalid(format!("{tags} tag counts")));
    }
    let mut slots_by_tag = Vec::with_capacity(tags);
    let mut level_of = Vec::with_capacity(tags);
    for _ in 0..tags {
        slots_by_tag.push(read_u64(&mut r)?);
        level_of.push(read_bytes::<1>(&mut r)?[0]);
    }
    let count = read_u32(&mut r)? as usize;
    let mut generations = BTreeMap::new();
    for _ in 0..count {
        let id = read_u64(&mut r)?;
        generations.insert(id, read_bytes::<1>(&mut r)?[0] != 0);
    }
    if !r.is_empty() {
        return Err(invalid("bytes after the header"));
    }
    let geometry = Geometry {
        base: usize::try_from(base).map_err(|_| invalid("a table too large for this machine"))?,
        max_level,
    };
    Ok((
        Header {
            seed,
            geometry,
            level,
            overflowed,
            slots_by_tag,
            level_of,
        },
        Stamp {
            commit_seq,
            generations,
        },
    ))
}

fn read_bytes<const N: usize>(r: &mut impl Read) -> std::io::Result<[u8; N]> {
    let mut b = [0u8; N];
    r.read_exact(&mut b)?;
    Ok(b)
}

fn read_u32(r: &mut impl Read) -> std::io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}
