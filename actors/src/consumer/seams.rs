//! How the pipeline reaches its two seams, the core's [`dedupe::store::IdStore`] (where it looks
//! ids up and records them) and [`dedupe::output::Sink`] (where it publishes a batch in one
//! transaction). Both are blocking; the pipeline is async. In the worker it reaches them through
//! the actors that own them, [`LedgerActor`] on its own threads and [`Publisher`] on its own
//! arbiter; in the unit tests (`super::tests`) it calls the core's in-memory doubles in place
//! ([`InPlace`]). The per-batch protocol in [`super::Pipeline`] is written against
//! [`StoreAccess`] and [`SinkAccess`] only, so its order and its failure handling are tested
//! without a broker or a ledger on disk, over doubles the core's conformance suite holds to the
//! real ledger.

use std::sync::Arc;

use actix::prelude::*;
use dedupe::identity::LedgerKey;
use dedupe::ledger::{Mark, Verdict};
use dedupe::output::{Committed, PublishError};
use dedupe::progress::Progress;
use dedupe::store::Looked;

use super::{NewId, PipelineError};
use crate::ledger::{CheckAndRecord, LedgerActor, Lookup, MarkIds};
use crate::producer::{Outgoing, Publish, Publisher};

/// The pipeline's way to its [`dedupe::store::IdStore`].
pub(crate) trait StoreAccess {
    /// [`dedupe::store::IdStore::look_up`].
    async fn look_up(&self, partition: i32, keys: Vec<LedgerKey>) -> Result<Looked, PipelineError>;

    /// [`dedupe::store::IdStore::record`], with the progress that follows the batch: the
    /// store's verdict on each id as it recorded it.
    async fn record(
        &self,
        partition: i32,
        items: Vec<NewId>,
        progress: Progress,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<Vec<Verdict>, PipelineError>;

    /// Marks ids forgotten (their forget just committed): [`dedupe::store::IdStore::mark`], as
    /// the newest.
    async fn forget(
        &self,
        partition: i32,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError>;
}

/// The pipeline's way to its [`dedupe::output::Sink`]: a batch, with the input offset that
/// follows it, in one transaction. The outer error is the sink being gone; the inner one the
/// transaction's.
pub(crate) trait SinkAccess {
    async fn publish(
        &self,
        partition: i32,
        outgoing: Arc<Outgoing>,
        next_input_offset: i64,
    ) -> Result<Result<Committed, PublishError>, PipelineError>;
}

impl StoreAccess for Addr<LedgerActor> {
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
    ) -> Result<Vec<Verdict>, PipelineError> {
        self.send(CheckAndRecord {
            partition,
            items,
            progress: Some(progress),
            marks,
        })
        .await
        .map_err(|source| PipelineError::Mailbox { partition, source })?
        .map_err(|source| PipelineError::Ledger { partition, source })
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

impl SinkAccess for Addr<Publisher> {
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

/// A store or a sink called in place, on the pipeline's own task: for doubles, which never block
/// (the worker's ledger and producer do, and are reached through their actors).
#[cfg(test)]
pub(crate) struct InPlace<T> {
    pub(crate) inner: std::cell::RefCell<T>,
    /// The input topic a sink's batches name.
    pub(crate) input_topic: String,
}

#[cfg(test)]
impl<T> InPlace<T> {
    pub(crate) fn new(inner: T) -> Self {
        Self {
            inner: std::cell::RefCell::new(inner),
            input_topic: "in".to_string(),
        }
    }
}

#[cfg(test)]
impl<S: dedupe::store::IdStore> StoreAccess for InPlace<S> {
    async fn look_up(&self, partition: i32, keys: Vec<LedgerKey>) -> Result<Looked, PipelineError> {
        self.inner
            .borrow()
            .look_up(&keys)
            .map_err(|source| PipelineError::Ledger { partition, source })
    }

    async fn record(
        &self,
        partition: i32,
        items: Vec<NewId>,
        progress: Progress,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<Vec<Verdict>, PipelineError> {
        self.inner
            .borrow()
            .record(partition, &items, &progress.encode(), &marks)
            .map_err(|source| PipelineError::Ledger { partition, source })
    }

    async fn forget(
        &self,
        partition: i32,
        marks: Vec<(LedgerKey, Mark)>,
    ) -> Result<(), PipelineError> {
        self.inner
            .borrow()
            .mark(&marks, dedupe::ledger::MarkOrder::Newest)
            .map_err(|source| PipelineError::Ledger { partition, source })
    }
}

#[cfg(test)]
impl<K: dedupe::output::Sink<Group = ()>> SinkAccess for InPlace<K> {
    async fn publish(
        &self,
        partition: i32,
        outgoing: Arc<Outgoing>,
        next_input_offset: i64,
    ) -> Result<Result<Committed, PublishError>, PipelineError> {
        let batch = outgoing.batch(&self.input_topic, partition, next_input_offset);
        Ok(self.inner.borrow_mut().publish(&batch, &()))
    }
}
