//! Opening a ledger: creating it atomically (the creation marker), checking the directory and the
//! column families it holds, opening RocksDB, checking (and upgrading) the format, and reconciling
//! the generation metadata with the column families. Then what a crash left is recovered
//! (`recover.rs`) and the id index rebuilt (`rebuild.rs`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Mutex;

use rocksdb::{Cache, ColumnFamilyDescriptor, Options, WriteBatch};

use super::buffer::new_buffer;
use super::error::{io_error, rocks, Doing};
use super::format::{
    generation_cf_name, generation_meta_key, parse_json, to_json, META_FORGOTTEN,
    META_FORMAT_VERSION, META_GENERATION_PREFIX,
};
use super::index::IdIndex;
use super::index_file::IndexSource;
use super::tuning::{db_options, generation_cf_options, small_cf_options};
use super::{
    Db, Durability, Generation, GenerationMeta, Ledger, LedgerError, LedgerOptions, Result, State,
    CF_META, CF_PROGRESS, CREATING_MARKER, FORMAT_VERSION, GENERATION_CF_PREFIX,
    OLDEST_READABLE_FORMAT_VERSION, SECONDS_FORMAT_VERSION,
};
use crate::Partition;

impl Ledger {
    /// Opens (with `create`, creating) the ledger at `path`: see [`Ledger::open`] and
    /// [`Ledger::open_existing`].
    pub(super) fn open_inner(path: &Path, options: LedgerOptions, create: bool) -> Result<Ledger> {
        let started = std::time::Instant::now();
        let path = path.to_path_buf();
        let fresh = prepare_dir(&path, create)?;
        let db_opts = db_options(&options, fresh);
        let names = column_families(&db_opts, &path, fresh)?;
        let block_cache = Cache::new_lru_cache(options.block_cache_bytes);
        let db = open_db(&db_opts, &path, &names, &options, &block_cache)?;
        let db_seconds = started.elapsed().as_secs_f64();
        let state = empty_state();
        let ledger = Ledger {
            db,
            path,
            options,
            block_cache,
            state: std::sync::Arc::new(Mutex::new(state)),
            index_stores: Mutex::new(Vec::new()),
            disk_lookups: std::sync::atomic::AtomicU64::new(0),
            opened: std::sync::OnceLock::new(),
        };
        let source = ledger.load(fresh, &names)?;
        if fresh {
            // The format marker must be on disk before the creation marker goes: without a WAL
            // it is only in a memtable until flushed.
            ledger.flush_cfs(&[CF_META, CF_PROGRESS], true)?;
            remove_durably(&ledger.path, CREATING_MARKER)?;
        }
        let seconds = started.elapsed().as_secs_f64();
        let _ = ledger.opened.set(super::OpenReport {
            seconds,
            index: source,
        });
        crate::metrics::events::LedgerOpened {
            path: &ledger.path,
            seconds,
            db_seconds,
            index: source.label(),
        }
        .emit();
        Ok(ledger)
    }

    /// Reads the format marker and generation metadata, and reconciles them with the column
    /// families (a crash can leave a generation created but not yet described, or described but
    /// already dropped). Then recovers what a crash left, rebuilds the id index and makes sure
    /// there is an active generation.
    fn load(&self, fresh: bool, cf_names: &[String]) -> Result<IndexSource> {
        self.check_format(fresh, cf_names)?;
        let mut forgotten = self.read_forgotten()?;
        let metas = self.read_generation_metas()?;
        let mut generations = self.reconcile_generations(cf_names, metas, &mut forgotten)?;
        let commit_seq = self.recover_commit(&mut generations, &mut forgotten)?;
        let marks = self.read_marks()?;
        self.remove_ingest_leftovers()?;
        super::index_file::remove_leftovers(&self.path)?;
        for g in generations.iter().filter(|g| g.meta.sealed) {
            self.compact_when_sealed(&g.name)?;
        }
        let mut state = self.lock();
        state.generations = generations;
        state.budget_floor = forgotten.clone();
        state.forgotten = forgotten;
        state.marks = marks;
        state.commit_seq = commit_seq;
        let source = self.build_index(&mut state)?;
        if state.generations.last().is_none_or(|g| g.meta.sealed) {
            self.start_generation(&mut state)?;
        }
        self.replay_log(&mut state)?;
        drop(state);
        self.record_limit()?;
        let mut state = self.lock();
        if fresh && self.options.durability == Durability::NoWal {
            // Without a WAL the format marker and the first generation's metadata live only in
            // memtables until a flush: a crash before the first flush would leave column families
            // without their marker, which the next open must refuse as corrupt. Flush them now.
            self.flush_locked(&mut state)?;
        }
        Ok(source)
    }

    /// Checks the format version marker: a fresh ledger gets one, an older readable format is
    /// upgraded, an unknown one is refused. A missing marker is only repaired in a ledger that
    /// holds nothing.
    fn check_format(&self, fresh: bool, cf_names: &[String]) -> Result<()> {
        let meta = self.cf(CF_META)?;
        let marker = self
            .db
            .get_cf(&meta, META_FORMAT_VERSION)
            .map_err(rocks(Doing::Read))?;
        drop(meta);
        match marker {
            Some(bytes) => {
                let found = <[u8; 4]>::try_from(bytes.as_slice())
                    .map(u32::from_le_bytes)
                    .map_err(|_| LedgerError::CorruptMetadata {
                        what: format!("format version is {} bytes, not 4", bytes.len()),
                    })?;
                if !(OLDEST_READABLE_FORMAT_VERSION..=FORMAT_VERSION).contains(&found) {
                    return Err(LedgerError::UnknownFormat { found });
                }
                if found < SECONDS_FORMAT_VERSION {
                    // The older format's data reads as is (its values and batch log records
                    // without digests too); from now on batch logs, commit records and digests
                    // are written, which older code would ignore or misread.
                    self.write_format_marker(true)?;
                }
            }
            None if fresh => self.write_format_marker(false)?,
            None if self.holds_nothing(cf_names)? => {
                // Left by a build whose creation was not atomic, killed before the marker was
                // written: no generation, no progress record, no metadata; nothing to lose.
                crate::metrics::events::LedgerCreationRestarted {
                    path: &self.path,
                    unmarked: true,
                }
                .emit();
                self.write_format_marker(true)?;
            }
            None => {
                return Err(LedgerError::CorruptMetadata {
                    what: "the format version marker is missing, yet the ledger holds generations or progress records".into(),
                })
            }
        }
        Ok(())
    }

    /// Writes the format version marker of a ledger without millisecond generations (synced when
    /// there is a WAL); with `flush`, also flushes it, so that it is durable without a WAL too.
    /// The first such generation marks it [`FORMAT_VERSION`] (`generations.rs`).
    fn write_format_marker(&self, flush: bool) -> Result<()> {
        let mut batch = WriteBatch::default();
        batch.put_cf(
            &self.cf(CF_META)?,
            META_FORMAT_VERSION,
            SECONDS_FORMAT_VERSION.to_le_bytes(),
        );
        self.db
            .write_opt(batch, &self.sync_write_options())
            .map_err(rocks(Doing::Write))?;
        if flush {
            self.flush_cfs(&[CF_META], true)?;
        }
        Ok(())
    }

    /// True if the ledger has no progress record and no generation holds a key.
    fn holds_nothing(&self, cf_names: &[String]) -> Result<bool> {
        let holders = cf_names
            .iter()
            .filter(|n| n.starts_with(GENERATION_CF_PREFIX))
            .map(String::as_str);
        for name in std::iter::once(CF_PROGRESS).chain(holders) {
            let cf = self.cf(name)?;
            if let Some(item) = self
                .db
                .iterator_cf(&cf, rocksdb::IteratorMode::Start)
                .next()
            {
                item.map_err(rocks(Doing::Read))?;
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Per partition, the latest first-seen time of any id already forgotten.
    fn read_forgotten(&self) -> Result<BTreeMap<Partition, i64>> {
        let meta = self.cf(CF_META)?;
        match self
            .db
            .get_cf(&meta, META_FORGOTTEN)
            .map_err(rocks(Doing::Read))?
        {
            Some(bytes) => parse_json("forgotten", &bytes),
            None => Ok(BTreeMap::new()),
        }
    }

    /// Every generation's metadata, by generation id.
    fn read_generation_metas(&self) -> Result<BTreeMap<u64, GenerationMeta>> {
        let meta = self.cf(CF_META)?;
        let mut metas = BTreeMap::new();
        for item in self.db.prefix_iterator_cf(&meta, META_GENERATION_PREFIX) {
            let (key, value) = item.map_err(rocks(Doing::Read))?;
            if !key.starts_with(META_GENERATION_PREFIX) {
                break;
            }
            let gm: GenerationMeta = parse_json("generation metadata", &value)?;
            metas.insert(gm.id, gm);
        }
        Ok(metas)
    }

    /// Brings the generation metadata and the column families in line, and returns the live
    /// generations, oldest first. A generation described but gone counts as forgotten; a column
    /// family not (or no longer) described is dropped.
    fn reconcile_generations(
        &self,
        cf_names: &[String],
        mut metas: BTreeMap<u64, GenerationMeta>,
        forgotten: &mut BTreeMap<Partition, i64>,
    ) -> Result<Vec<Generation>> {
        let mut generations = Vec::new();
        let mut batch = WriteBatch::default();
        let meta = self.cf(CF_META)?;
        // Described but gone: its drop finished, the metadata deletion did not survive.
        for (id, gm) in &metas {
            if !cf_names.contains(&generation_cf_name(*id)) {
                for (p, span) in &gm.partitions {
                    let f = forgotten.entry(*p).or_insert(span.last_seen_ms);
                    *f = (*f).max(span.last_seen_ms);
                }
                batch.delete_cf(&meta, generation_meta_key(*id));
            }
        }
        batch.put_cf(&meta, META_FORGOTTEN, to_json(&*forgotten));
        self.db
            .write_opt(batch, &self.sync_write_options())
            .map_err(rocks(Doing::Write))?;
        drop(meta);
        for name in cf_names
            .iter()
            .filter(|n| n.starts_with(GENERATION_CF_PREFIX))
        {
            let id: Option<u64> = name[GENERATION_CF_PREFIX.len()..].parse().ok();
            match id.and_then(|id| metas.remove(&id)) {
                Some(gm) => generations.push(Generation {
                    name: name.clone(),
                    meta: gm,
                }),
                // Present but never described (created just before a crash) or described no
                // more (being dropped): it holds nothing the ledger vouches for.
                None => self
                    .db
                    .drop_cf(name)
                    .map_err(rocks(Doing::Generation("drop", name)))?,
            }
        }
        generations.sort_by_key(|g| g.meta.id);
        Ok(generations)
    }
}

/// Makes sure `path` can hold a ledger, and says whether the ledger is to be created there
/// (`fresh`): a missing or empty directory, when `create` allows it, or one whose creation a crash
/// interrupted (then cleared). A fresh directory gets the creation marker before RocksDB writes
/// anything.
fn prepare_dir(path: &Path, create: bool) -> Result<bool> {
    let refuse = |reason: &str| LedgerError::NotALedger {
        path: path.to_path_buf(),
        reason: reason.into(),
    };
    let mut fresh = match std::fs::read_dir(path) {
        Ok(mut entries) => entries.next().is_none(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
            std::fs::create_dir_all(path).map_err(io_error("create", path))?;
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(refuse("the directory does not exist"))
        }
        Err(e) => return Err(io_error("read", path)(e)),
    };
    if fresh && !create {
        return Err(refuse("the directory is empty"));
    }
    if !fresh && path.join(CREATING_MARKER).exists() {
        if !create {
            return Err(refuse(
                "its creation never finished (a crash during the first start)",
            ));
        }
        crate::metrics::events::LedgerCreationRestarted {
            path,
            unmarked: false,
        }
        .emit();
        clear_dir(path)?;
        fresh = true;
    }
    if fresh {
        write_durably(path, CREATING_MARKER, b"this ledger is being created\n")?;
    }
    if !fresh && !path.join("CURRENT").exists() {
        return Err(LedgerError::NotALedger {
            path: path.to_path_buf(),
            reason: "the directory is not empty and has no CURRENT file".into(),
        });
    }
    Ok(fresh)
}

/// The column families to open: a fresh ledger's two small ones, or those the MANIFEST lists,
/// which must include them.
fn column_families(db_opts: &Options, path: &Path, fresh: bool) -> Result<Vec<String>> {
    if fresh {
        return Ok(vec![CF_META.to_string(), CF_PROGRESS.to_string()]);
    }
    let names = Db::list_cf(db_opts, path).map_err(rocks(Doing::Open(path)))?;
    if !names.iter().any(|n| n == CF_META) || !names.iter().any(|n| n == CF_PROGRESS) {
        // Either damage (e.g. a truncated MANIFEST lists fewer column families) or a
        // foreign database. A read-only open, which writes nothing, tells them apart and
        // gives RocksDB's reason.
        Db::open_cf_for_read_only(db_opts, path, &names, false)
            .map_err(rocks(Doing::Open(path)))?;
        return Err(LedgerError::NotALedger {
            path: path.to_path_buf(),
            reason: format!("its MANIFEST lists no {CF_META} and {CF_PROGRESS} column families (a damaged MANIFEST, or another database)"),
        });
    }
    Ok(names)
}

/// Opens the database with explicit column family descriptors, so that every generation keeps
/// its table options (filters included).
fn open_db(
    db_opts: &Options,
    path: &Path,
    names: &[String],
    options: &LedgerOptions,
    block_cache: &Cache,
) -> Result<Db> {
    let descriptors = names
        .iter()
        .filter(|n| n.as_str() != "default")
        .map(|name| {
            let cf_opts = if name.starts_with(GENERATION_CF_PREFIX) {
                generation_cf_options(options, block_cache)
            } else {
                small_cf_options()
            };
            ColumnFamilyDescriptor::new(name, cf_opts)
        });
    Db::open_cf_descriptors(db_opts, path, descriptors).map_err(rocks(Doing::Open(path)))
}

/// The in-memory state of a ledger before it is loaded: no generation, nothing buffered, and an
/// empty id index (or, without `build_index`, one that knows nothing).
fn empty_state() -> State {
    // The table is made when the index is built (`rebuild.rs`): loaded from its file, or new.
    // Making it here too held two full tables while a stored one loaded (twice the memory).
    let index = IdIndex::unknowing();
    State {
        generations: Vec::new(),
        forgotten: BTreeMap::new(),
        budget_floor: BTreeMap::new(),
        marks: Default::default(),
        pending: new_buffer(),
        pending_progress: BTreeMap::new(),
        pending_batches: 0,
        commit_seq: 0,
        log: None,
        index,
        in_flight: None,
        spare: None,
        index_stored_at: None,
        index_epoch: 0,
        loads: 0,
        reserved: 0,
        seal_requested: false,
        seal_deferrals: 0,
    }
}

/// Writes `name` in `dir` and makes both the file and its directory entry durable.
fn write_durably(dir: &Path, name: &str, contents: &[u8]) -> Result<()> {
    use std::io::Write;
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path).map_err(io_error("create", &path))?;
    file.write_all(contents)
        .and_then(|()| file.sync_all())
        .map_err(io_error("write", &path))?;
    sync_dir(dir)
}

/// Removes `name` from `dir` and makes the removal durable.
fn remove_durably(dir: &Path, name: &str) -> Result<()> {
    let path = dir.join(name);
    std::fs::remove_file(&path).map_err(io_error("remove", &path))?;
    sync_dir(dir)
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_error("sync", dir))
}

/// Removes everything inside `dir` (which is kept).
fn clear_dir(dir: &Path) -> Result<()> {
    for entry in std::fs::read_dir(dir).map_err(io_error("read", dir))? {
        let entry = entry.map_err(io_error("read", dir))?;
        let path = entry.path();
        let removed = if entry.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
        removed.map_err(io_error("clear", &path))?;
    }
    sync_dir(dir)
}
