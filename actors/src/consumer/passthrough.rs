//! The pipeline bench's baseline (`dedupe run --passthrough`, a hidden flag `dedupe bench
//! pipeline` gives its baseline worker): every record copied with the same consumer, producer
//! and transactions, without the ledger. Built only with the `passthrough` feature (which
//! `dedupe-cli`'s `tools` enables); the image's binary has no such mode.

use std::sync::Arc;

use dedupe::output::OutRecord;

use super::{InRecord, Pipeline, PipelineError};
use crate::producer::Outgoing;

impl Pipeline {
    /// Every record of the batch copied in one transaction, without the ledger.
    pub(super) async fn copy_through(&mut self, batch: Vec<InRecord>) -> Result<(), PipelineError> {
        let next_input_offset = batch[batch.len() - 1].offset + 1;
        self.metrics.records_in.increment(batch.len() as u64);
        let records: Vec<OutRecord> = batch.into_iter().map(|r| r.out).collect();
        let out_count = records.len() as u64;
        let outgoing = Arc::new(Outgoing {
            records,
            dead_letters: Vec::new(),
            audit: Vec::new(),
            new_ids: Vec::new(),
            marks: Vec::new(),
            other_marks: Vec::new(),
            positions: Vec::new(),
            dead_letter_positions: Vec::new(),
        });
        self.publish(&outgoing, next_input_offset)
            .await?
            .map_err(|refused| self.refused(&refused))?;
        self.metrics.records_out.increment(out_count);
        Ok(())
    }
}
