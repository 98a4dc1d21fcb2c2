//! The one exactly-once checker: reads the input and the output (`read_committed`) and compares
//! them partition by partition. The output holds every input id once, in the partition of its
//! input, as its first copy (key, value and headers), and per partition in the order of the
//! input's first copies.

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::{consume_all, Dedupe, Record};

/// What the two topics hold, compared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Count {
    pub input_records: usize,
    pub output_records: usize,
    /// Distinct ids in the input.
    pub distinct: usize,
    /// Output records whose id an earlier output record already had.
    pub duplicates: usize,
    /// Input ids the output lacks.
    pub missing: usize,
    /// Output records in another partition than their id's input.
    pub misplaced: usize,
    /// Output records that are not their id's first input copy (another value or headers).
    pub not_first_copy: usize,
    /// Partitions whose output is not the input's first copies in input order.
    pub out_of_order: usize,
}

impl Count {
    /// Reads both topics to their ends and compares them. Every input record must have a key
    /// (the message id).
    pub fn of(input: &str, output: &str) -> Self {
        Self::compare(&consume_all(input, true), &consume_all(output, true))
    }

    pub fn compare(input: &[Record], output: &[Record]) -> Self {
        let mut first_copies: HashMap<i32, Vec<&[u8]>> = HashMap::new();
        let mut first: HashMap<&[u8], &Record> = HashMap::new();
        for r in input {
            let key = r.key.as_deref().expect("every input record has a key");
            if !first.contains_key(key) {
                first.insert(key, r);
                first_copies.entry(r.partition).or_default().push(key);
            }
        }
        let mut published: HashMap<i32, Vec<&[u8]>> = HashMap::new();
        let mut seen = HashSet::new();
        let (mut duplicates, mut misplaced, mut not_first_copy) = (0, 0, 0);
        for r in output {
            let key = r.key.as_deref().expect("the output keeps the key");
            if !seen.insert(key) {
                duplicates += 1;
            }
            match first.get(key) {
                Some(f) if f.partition != r.partition => misplaced += 1,
                Some(f) if f.value != r.value || f.headers != r.headers => not_first_copy += 1,
                _ => {}
            }
            published.entry(r.partition).or_default().push(key);
        }
        let missing = first.keys().filter(|k| !seen.contains(*k)).count();
        let out_of_order = first_copies
            .iter()
            .filter(|(p, ids)| published.get(p) != Some(ids))
            .count()
            + published
                .keys()
                .filter(|p| !first_copies.contains_key(p))
                .count();
        Count {
            input_records: input.len(),
            output_records: output.len(),
            distinct: first.len(),
            duplicates,
            missing,
            misplaced,
            not_first_copy,
            out_of_order,
        }
    }

    /// Panics, naming `what` and the counts, unless the output is exactly once and in order.
    pub fn assert_exactly_once(&self, what: &str) {
        let wrong = (
            self.duplicates,
            self.missing,
            self.misplaced,
            self.not_first_copy,
            self.out_of_order,
        );
        assert_eq!(
            wrong,
            (0, 0, 0, 0, 0),
            "{what}: the output is not every input id once, as its first copy, in order: {self:?}"
        );
        assert_eq!(self.output_records, self.distinct, "{what}: {self:?}");
    }
}

/// Checks the output twice: this crate's [`Count`] and `dedupe verify`; panics unless both say
/// every one of `distinct` ids is there once, in its partition, as its first copy, in input order.
/// Returns the count.
pub fn assert_exactly_once(
    dedupe: Dedupe,
    input: &str,
    output: &str,
    distinct: usize,
    what: &str,
) -> Count {
    let count = Count::of(input, output);
    count.assert_exactly_once(what);
    assert_eq!(
        count.distinct, distinct,
        "{what}: the input holds {} distinct ids, not the {distinct} sent: {count:?}",
        count.distinct
    );
    let (code, summary) = dedupe.verify(input, output);
    assert_eq!(code, 0, "{what}: dedupe verify: {summary}");
    count
}

/// The input records that are not their id's first copy, read committed: (partition, offset) ->
/// record. These are what the worker drops.
pub fn dropped_copies(input: &str) -> BTreeMap<(i32, i64), Record> {
    let mut seen = HashSet::new();
    consume_all(input, true)
        .into_iter()
        .filter(|r| !seen.insert(r.key.clone()))
        .map(|r| ((r.partition, r.offset), r))
        .collect()
}

/// The duplicate audit's records, read committed, as JSON values keyed by the input record each
/// names; panics if two name the same one.
pub fn audit_records(topic: &str) -> BTreeMap<(i32, i64), (Record, serde_json::Value)> {
    let mut out = BTreeMap::new();
    for r in consume_all(topic, true) {
        let v: serde_json::Value =
            serde_json::from_slice(r.value.as_deref().expect("an audit record has a value"))
                .expect("JSON");
        let at = (
            v["input_partition"].as_i64().expect("input_partition") as i32,
            v["input_offset"].as_i64().expect("input_offset"),
        );
        assert!(
            out.insert(at, (r, v)).is_none(),
            "two audit records name input {at:?}"
        );
    }
    out
}

/// Checks that the output's duplicate audit holds one record for each dropped copy of the input
/// and nothing else: exactly as committed as the output (no cap or sampling in the way).
pub fn assert_audit_holds_the_drops(input: &str, output: &str, what: &str) {
    let dropped = dropped_copies(input);
    let audited = audit_records(&dedupe::audit::default_topic(output));
    let missing: Vec<_> = dropped
        .keys()
        .filter(|k| !audited.contains_key(k))
        .take(5)
        .collect();
    let extra: Vec<_> = audited
        .keys()
        .filter(|k| !dropped.contains_key(k))
        .take(5)
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty() && dropped.len() == audited.len(),
        "{what}: the audit holds {} records for {} dropped copies; missing e.g. {missing:?}, not dropped e.g. {extra:?}",
        audited.len(),
        dropped.len()
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(partition: i32, offset: i64, key: &str, value: &str) -> Record {
        Record {
            partition,
            offset,
            key: Some(key.into()),
            value: Some(value.into()),
            headers: Vec::new(),
            timestamp: None,
        }
    }

    /// Ids a, b (re-sent later with another value) in partition 0, c in partition 1.
    fn input() -> Vec<Record> {
        vec![
            record(0, 0, "a", "1"),
            record(0, 1, "b", "2"),
            record(0, 2, "b", "2 again"),
            record(1, 0, "c", "3"),
        ]
    }

    #[test]
    fn the_first_copies_in_order_are_exactly_once() {
        let output = vec![
            record(0, 0, "a", "1"),
            record(0, 1, "b", "2"),
            record(1, 0, "c", "3"),
        ];
        let count = Count::compare(&input(), &output);
        count.assert_exactly_once("the first copies");
        assert_eq!((count.input_records, count.distinct), (4, 3));
    }

    #[test]
    fn each_way_of_going_wrong_is_counted() {
        // b twice: one duplicate.
        let twice = vec![
            record(0, 0, "a", "1"),
            record(0, 1, "b", "2"),
            record(0, 2, "b", "2"),
            record(1, 0, "c", "3"),
        ];
        assert_eq!(Count::compare(&input(), &twice).duplicates, 1);
        // c never published: missing.
        let without_c = vec![record(0, 0, "a", "1"), record(0, 1, "b", "2")];
        assert_eq!(Count::compare(&input(), &without_c).missing, 1);
        // c in partition 0: misplaced.
        let moved = vec![
            record(0, 0, "a", "1"),
            record(0, 1, "b", "2"),
            record(0, 2, "c", "3"),
        ];
        assert_eq!(Count::compare(&input(), &moved).misplaced, 1);
        // b's later copy instead of its first.
        let later = vec![
            record(0, 0, "a", "1"),
            record(0, 1, "b", "2 again"),
            record(1, 0, "c", "3"),
        ];
        assert_eq!(Count::compare(&input(), &later).not_first_copy, 1);
        // b before a.
        let swapped = vec![
            record(0, 0, "b", "2"),
            record(0, 1, "a", "1"),
            record(1, 0, "c", "3"),
        ];
        assert_eq!(Count::compare(&input(), &swapped).out_of_order, 1);
    }
}
