//! The pipeline's two seams: where it looks ids up and records them (an [`IdStore`]: the ledger
//! actor), and where it publishes a batch in one transaction (a [`Sink`]: the producer actor).
//! The per-batch protocol in [`super::Pipeline`] is written against these traits only, so its
//! order and its failure handling are unit-tested with in-memory doubles (`super::tests`), without
//! a broker or a ledger on disk.

use std::sync::Arc;

use actix::prelude::*;
use dedupe::identity::LedgerKey;
use dedupe::ledger::Mark;
use dedupe::output::{Committed, PublishError};
use dedupe::progress::Progress;

use super::{NewId, PipelineError};
use crate::ledger::{CheckAndRecord, LedgerActor, Looked, Lookup, MarkIds};
use crate::producer::{Outgoing, Publish, Publisher};

/// Where a partition's pipeline looks its ids up and records the new ones.
pub(crate) trait IdStore {
    /// What the store holds of each key (its first-seen time and digest), in the keys' order,
    /// and which keys were forgotten (not held).
    async fn look_up(&self, partition: i32, keys: Vec<LedgerKey>) -> Result<Looked, PipelineError>;

    /// Records the new ids with the progress that follows their batch, atomically, with `marks`
    /// made durable first.
    async fn record(
        &self,
        partition: i32,
        items: Vec<NewId>,
        progress: Progress,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError>;

    /// Marks ids forgotten (their forget just committed).
    async fn forget(
        &self,
        partition: i32,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError>;
}

/// Where a partition's pipeline publishes a batch, with the input offset that follows it, in one
/// transaction. The outer error is the sink being gone; the inner one the transaction's.
pub(crate) trait Sink {
    async fn publish(
        &self,
        partition: i32,
        outgoing: Arc<Outgoing>,
        next_input_offset: i64,
    ) -> Result<Result<Committed, PublishError>, PipelineError>;
}

impl IdStore for Addr<LedgerActor> {
    async fn look_up(&self, partition: i32, keys: Vec<LedgerKey>) -> Result<Looked, PipelineError> {
        self.send(Lookup { keys })
            .await
            .map_err(|source| PipelineError::Mailbox { partition, source })?
            .map_err(|source| PipelineError::Ledger { partition, source })
    }

    async fn record(
        &self,
        partition: i32,
        items: Vec<NewId>,
        progress: Progress,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError> {
        self.send(CheckAndRecord {
            partition,
            items,
            progress: Some(progress),
            marks,
        })
        .await
        .map_err(|source| PipelineError::Mailbox { partition, source })?
        .map_err(|source| PipelineError::Ledger { partition, source })?;
        // The ledger judges the ids again as it records them, and its verdicts are not needed:
        // the batch was decided on the look-up, and only the ids it published or refreshed come
        // here. The second judgement is what records them by the same rules (a refresh only
        // forward in time, a copy past the retention limit as a new sighting) and keeps a record
        // from counting an id twice when a copy on another of the worker's partitions recorded it
        // in between.
        Ok(())
    }

    async fn forget(
        &self,
        partition: i32,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError> {
        self.send(MarkIds { marks })
            .await
            .map_err(|source| PipelineError::Mailbox { partition, source })?
            .map_err(|source| PipelineError::Ledger { partition, source })
    }
}

impl Sink for Addr<Publisher> {
    async fn publish(
        &self,
        partition: i32,
        outgoing: Arc<Outgoing>,
        next_input_offset: i64,
    ) -> Result<Result<Committed, PublishError>, PipelineError> {
        self.send(Publish {
            outgoing,
            next_input_offset,
        })
        .await
        .map_err(|source| PipelineError::Mailbox { partition, source })
    }
}
