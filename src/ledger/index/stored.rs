//! The index as its file stores it: the header beside the table, and an index made again from
//! the two.

use super::place::Geometry;
use super::{IdIndex, TAGS};

/// The parts of an index that its file stores beside the table (see `index_file.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub(crate) seed: u64,
    pub(crate) geometry: Geometry,
    pub(crate) level: u8,
    pub(crate) overflowed: u64,
    pub(crate) slots_by_tag: Vec<u64>,
    pub(crate) level_of: Vec<u8>,
}

impl IdIndex {
    /// Whether the index holds anything (false for one opened without `build_index`).
    pub(crate) fn knows(&self) -> bool {
        self.knows
    }

    /// What the file stores beside the table.
    pub(crate) fn header(&self) -> Header {
        Header {
            seed: self.seed,
            geometry: self.geometry,
            level: self.level,
            overflowed: self.overflowed,
            slots_by_tag: self.slots_by_tag.to_vec(),
            level_of: self.level_of.to_vec(),
        }
    }

    /// The table's bytes (no doubling under way: see [`IdIndex::finish_growth`]).
    pub(crate) fn table(&self) -> &[u8] {
        debug_assert!(!self.growing(), "the table is read whole while it doubles");
        self.region.bytes(self.table_len())
    }

    /// An index of `header`'s sizes and seed whose table `fill` writes, with every tag dead (the
    /// caller makes the generations it trusts live again with [`IdIndex::revive`]). `None` if
    /// `header` does not describe a table of `geometry`.
    pub(crate) fn from_parts(
        header: &Header,
        geometry: Geometry,
        fill: impl FnOnce(&mut [u8]) -> std::io::Result<()>,
    ) -> std::io::Result<Option<IdIndex>> {
        let sound = header.geometry == geometry
            && header.level <= geometry.max_level
            && header.slots_by_tag.len() == TAGS
            && header.level_of.len() == TAGS
            && header.level_of.iter().all(|&l| l <= header.level);
        if !sound {
            return Ok(None);
        }
        let mut index = IdIndex::allocate(geometry, header.level, header.seed);
        let len = index.table_len();
        fill(index.region.bytes_mut(len))?;
        index.overflowed = header.overflowed;
        index.slots_by_tag.copy_from_slice(&header.slots_by_tag);
        index.level_of.copy_from_slice(&header.level_of);
        Ok(Some(index))
    }
}
