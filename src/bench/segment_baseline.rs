//! Segment's published ledger design, as the bench's baseline: one RocksDB key per id (value =
//! its sequence number) plus a sequence-number index column family, default RocksDB tuning with
//! a 10-bit bloom filter, and size-bounded aging that deletes the oldest entries one by one
//! through the index.
//!
//! It is implemented faithfully and without handicaps: both column families get the bloom filter
//! (opened with explicit descriptors), a batch is one MultiGet and one atomic WriteBatch with the
//! default (unsynced) WAL, and aging seeks straight to the oldest live sequence number instead of
//! scanning over tombstones.

use std::collections::HashSet;
use std::path::Path;

use rocksdb::{BlockBasedOptions, ColumnFamilyDescriptor, Options, WriteBatch, DB};

const CF_IDS: &str = "ids";
const CF_INDEX: &str = "index";
/// How often (in batches) the baseline measures its size against the budget.
const AGING_CHECK_EVERY_BATCHES: u64 = 16;
/// Share of held ids deleted per aging round once over budget.
const AGING_FRACTION: u64 = 50;

/// The baseline ledger.
pub struct SegmentLedger {
    db: DB,
    next_seq: u64,
    oldest_seq: u64,
    budget_bytes: Option<u64>,
    batches: u64,
}

impl SegmentLedger {
    /// Opens (creates) a baseline ledger at `path` with an optional disk budget.
    pub fn open(path: &Path, budget_bytes: Option<u64>) -> Result<SegmentLedger, rocksdb::Error> {
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        let cf_opts = || {
            let mut table = BlockBasedOptions::default();
            table.set_bloom_filter(10.0, false);
            let mut cf = Options::default();
            cf.set_block_based_table_factory(&table);
            cf
        };
        let db = DB::open_cf_descriptors(
            &db_opts,
            path,
            [
                ColumnFamilyDescriptor::new(CF_IDS, cf_opts()),
                ColumnFamilyDescriptor::new(CF_INDEX, cf_opts()),
            ],
        )?;
        Ok(SegmentLedger {
            db,
            next_seq: 0,
            oldest_seq: 0,
            budget_bytes,
            batches: 0,
        })
    }

    /// Checks a batch and records its new ids; `true` for each duplicate.
    pub fn check_and_record(&mut self, keys: &[[u8; 16]]) -> Result<Vec<bool>, rocksdb::Error> {
        let (Some(ids), Some(index)) = (self.db.cf_handle(CF_IDS), self.db.cf_handle(CF_INDEX))
        else {
            unreachable!("both column families are created at open");
        };
        let found = self.db.multi_get_cf(keys.iter().map(|k| (ids, k)));
        let mut in_batch = HashSet::with_capacity(keys.len());
        let mut batch = WriteBatch::default();
        let mut dups = Vec::with_capacity(keys.len());
        for (key, found) in keys.iter().zip(found) {
            let dup = found?.is_some() || !in_batch.insert(*key);
            if !dup {
                let seq = self.next_seq.to_be_bytes();
                self.next_seq += 1;
                batch.put_cf(ids, key, seq);
                batch.put_cf(index, seq, key);
            }
            dups.push(dup);
        }
        self.db.write(batch)?;
        self.batches += 1;
        if self.batches.is_multiple_of(AGING_CHECK_EVERY_BATCHES) {
            self.age()?;
        }
        Ok(dups)
    }

    /// Bytes on disk plus in memtables.
    pub fn size_bytes(&self) -> Result<u64, rocksdb::Error> {
        let mut total = 0;
        for name in [CF_IDS, CF_INDEX] {
            if let Some(cf) = self.db.cf_handle(name) {
                for p in [
                    "rocksdb.live-sst-files-size",
                    "rocksdb.cur-size-all-mem-tables",
                ] {
                    total += self.db.property_int_value_cf(cf, p)?.unwrap_or(0);
                }
            }
        }
        Ok(total)
    }

    /// Ids held.
    pub fn held(&self) -> u64 {
        self.next_seq - self.oldest_seq
    }

    fn age(&mut self) -> Result<(), rocksdb::Error> {
        let Some(budget) = self.budget_bytes else {
            return Ok(());
        };
        if self.size_bytes()? <= budget {
            return Ok(());
        }
        let (Some(ids), Some(index)) = (self.db.cf_handle(CF_IDS), self.db.cf_handle(CF_INDEX))
        else {
            unreachable!("both column families are created at open");
        };
        let to_delete = (self.held() / AGING_FRACTION).max(1);
        let mut batch = WriteBatch::default();
        let mut deleted = 0;
        let start = self.oldest_seq.to_be_bytes();
        let iter = self.db.iterator_cf(
            index,
            rocksdb::IteratorMode::From(&start, rocksdb::Direction::Forward),
        );
        for item in iter.take(to_delete as usize) {
            let (seq, key) = item?;
            batch.delete_cf(ids, &key);
            batch.delete_cf(index, &seq);
            deleted += 1;
        }
        self.db.write(batch)?;
        self.oldest_seq += deleted;
        Ok(())
    }
}
