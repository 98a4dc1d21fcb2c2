//! The bench's ids: random UUIDv4s with a share of re-sent recent ids, the same for every store.

use std::collections::VecDeque;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use crate::identity::LedgerKey;

/// Batches a re-sent id may reach back over (client retries re-send recent messages).
const RETRY_HORIZON_BATCHES: usize = 16;
/// Simulated stream rate used to give ids event times.
const SIMULATED_IDS_PER_MS: u64 = 100;

/// A deterministic stream of random UUIDv4 ids with re-sent recent ids mixed in.
pub struct IdStream {
    rng: SmallRng,
    dup_ratio: f64,
    recent: VecDeque<LedgerKey>,
    recent_cap: usize,
    emitted: u64,
}

impl IdStream {
    /// A stream; the same seed gives the same ids.
    pub fn new(seed: u64, dup_ratio: f64, batch: usize) -> IdStream {
        IdStream {
            rng: SmallRng::seed_from_u64(seed),
            dup_ratio,
            recent: VecDeque::new(),
            recent_cap: batch * RETRY_HORIZON_BATCHES,
            emitted: 0,
        }
    }

    /// Fills `out` with the next `n` ids; returns how many are re-sent.
    pub fn next_batch(&mut self, n: usize, out: &mut Vec<(LedgerKey, i64)>) -> u64 {
        out.clear();
        let mut resent = 0;
        for _ in 0..n {
            let time_ms = (self.emitted / SIMULATED_IDS_PER_MS) as i64;
            self.emitted += 1;
            if !self.recent.is_empty() && self.rng.random_bool(self.dup_ratio) {
                let i = self.rng.random_range(0..self.recent.len());
                out.push((self.recent[i], time_ms));
                resent += 1;
                continue;
            }
            let mut bytes = self.rng.random::<u128>().to_be_bytes();
            bytes[6] = (bytes[6] & 0x0f) | 0x40;
            bytes[8] = (bytes[8] & 0x3f) | 0x80;
            let key = LedgerKey(bytes);
            if self.recent.len() == self.recent_cap {
                self.recent.pop_front();
            }
            self.recent.push_back(key);
            out.push((key, time_ms));
        }
        resent
    }
}
