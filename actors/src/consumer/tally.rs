//! What a batch's decision counts, kept until its transaction commits. A batch the output refuses
//! part of is decided again in smaller parts (`protocol.rs`, `settle`), so a count made while
//! deciding would count a record once per attempt; counted from the tally of the attempt that
//! committed, each record counts once.

use dedupe::config::UnkeyedPolicy;
use dedupe::identity::Unkeyed;
use metrics::Counter;

use super::seams::{SinkAccess, StoreAccess};
use super::Pipeline;

/// The counts of one attempt's decision, not yet applied.
#[derive(Default)]
pub(super) struct Tally {
    /// Counters to add one to, in the order the decision made them.
    counts: Vec<Counter>,
    /// Counters to add more than one to.
    sums: Vec<(Counter, u64)>,
    /// The ages of the dropped duplicates' first copies, in seconds.
    duplicate_ages: Vec<f64>,
    /// Records without a usable id, by reason and the policy that handled them.
    unkeyed: Vec<(Unkeyed, UnkeyedPolicy)>,
}

impl Tally {
    pub(super) fn one(&mut self, counter: &Counter) {
        self.counts.push(counter.clone());
    }

    pub(super) fn add(&mut self, counter: &Counter, n: u64) {
        if n > 0 {
            self.sums.push((counter.clone(), n));
        }
    }

    pub(super) fn duplicate_age(&mut self, seconds: f64) {
        self.duplicate_ages.push(seconds);
    }

    pub(super) fn unkeyed(&mut self, reason: Unkeyed, policy: UnkeyedPolicy) {
        self.unkeyed.push((reason, policy));
    }
}

impl<S: StoreAccess, K: SinkAccess> Pipeline<S, K> {
    /// Applies the tally of an attempt whose transaction committed.
    pub(super) fn count(&mut self, tally: Tally) {
        for counter in tally.counts {
            counter.increment(1);
        }
        for (counter, n) in tally.sums {
            counter.increment(n);
        }
        for age in tally.duplicate_ages {
            self.metrics.duplicate_age.record(age);
        }
        for (reason, policy) in tally.unkeyed {
            self.unkeyed(reason, policy);
        }
    }
}
