//! Kafka client factories: every client the service makes starts from [`client_config`], so
//! security settings and pass-through properties apply everywhere alike.

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::ClientConfig;

use crate::config::KafkaConfig;

/// The base configuration of every Kafka client: brokers, security, pass-through properties.
pub fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &kafka.brokers);
    cfg.set("security.protocol", kafka.security_protocol.as_librdkafka());
    if let Some(m) = &kafka.sasl_mechanism {
        cfg.set("sasl.mechanisms", m);
    }
    if let Some(u) = &kafka.sasl_username {
        cfg.set("sasl.username", u);
    }
    if let Some(p) = &kafka.sasl_password {
        cfg.set("sasl.password", p.expose());
    }
    for (k, v) in &kafka.properties {
        cfg.set(k, v);
    }
    cfg
}

/// The number of partitions of `topic`, or `None` if the topic does not exist.
pub fn partition_count(kafka: &KafkaConfig, topic: &str, timeout: Duration) -> Result<Option<usize>, KafkaError> {
    let consumer: BaseConsumer = client_config(kafka).create()?;
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    Ok(md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len())
        .filter(|&n| n > 0))
}

/// Creates `topic` with `partitions` partitions and `replication` replicas (-1: the brokers'
/// `default.replication.factor`), tolerating an existing topic.
pub async fn create_topic(
    kafka: &KafkaConfig,
    topic: &str,
    partitions: i32,
    replication: i32,
    configs: &[(&str, &str)],
) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> = client_config(kafka).create()?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(30)));
    for result in admin.create_topics([&new], &opts).await? {
        match result {
            Ok(_) => {}
            Err((_, rdkafka::types::RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((_, code)) => return Err(KafkaError::AdminOp(code)),
        }
    }
    Ok(())
}

/// The topic's `retention.ms` (-1: forever), or `None` when the broker does not say.
pub async fn topic_retention_ms(kafka: &KafkaConfig, topic: &str) -> Result<Option<i64>, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = client_config(kafka).create()?;
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let results = admin.describe_configs([&rdkafka::admin::ResourceSpecifier::Topic(topic)], &opts).await?;
    for result in results {
        let resource = result.map_err(KafkaError::AdminOp)?;
        if let Some(value) = resource.get("retention.ms").and_then(|e| e.value.as_deref()) {
            return Ok(value.parse().ok());
        }
    }
    Ok(None)
}

/// Reads every partition of `topic` from its beginning to its end (the last stable offset when
/// `read_committed`), calling `each` with every record, then returns how many were read.
/// Fails if the end is not reached within `timeout`.
pub fn read_to_end(
    kafka: &KafkaConfig,
    topic: &str,
    read_committed: bool,
    timeout: Duration,
    each: &mut dyn FnMut(&rdkafka::message::BorrowedMessage<'_>),
) -> Result<u64, ReadError> {
    read_from(kafka, topic, read_committed, &std::collections::HashMap::new(), timeout, each)
}

/// Like [`read_to_end`], starting each partition at the offset `start` gives (else its beginning).
pub fn read_from(
    kafka: &KafkaConfig,
    topic: &str,
    read_committed: bool,
    start: &std::collections::HashMap<i32, i64>,
    timeout: Duration,
    each: &mut dyn FnMut(&rdkafka::message::BorrowedMessage<'_>),
) -> Result<u64, ReadError> {
    use rdkafka::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = client_config(kafka)
        .set("group.id", format!("dedupe-reader-{}", uuid::Uuid::new_v4().simple()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", if read_committed { "read_committed" } else { "read_uncommitted" })
        .create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let parts: Vec<i32> = md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().iter().map(|p| p.id()).collect())
        .unwrap_or_default();
    if parts.is_empty() {
        return Err(ReadError::NoSuchTopic(topic.to_string()));
    }
    let mut tpl = TopicPartitionList::new();
    for p in &parts {
        let offset = start.get(p).map(|o| Offset::Offset(*o)).unwrap_or(Offset::Beginning);
        tpl.add_partition_offset(topic, *p, offset)?;
    }
    consumer.assign(&tpl)?;
    let mut at_end: std::collections::HashMap<i32, bool> = parts.iter().map(|p| (*p, false)).collect();
    let deadline = std::time::Instant::now() + timeout;
    let mut n = 0;
    while at_end.values().any(|e| !e) {
        if std::time::Instant::now() > deadline {
            return Err(ReadError::Timeout { topic: topic.to_string(), seconds: timeout.as_secs() });
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(m)) => {
                at_end.insert(rdkafka::Message::partition(&m), false);
                n += 1;
                each(&m);
            }
        }
    }
    Ok(n)
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("topic {0} does not exist")]
    NoSuchTopic(String),
    #[error("reading {topic} did not reach its end within {seconds}s")]
    Timeout { topic: String, seconds: u64 },
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// High watermarks of every partition of `topic`.
pub fn high_watermarks(kafka: &KafkaConfig, topic: &str) -> Result<std::collections::HashMap<i32, i64>, ReadError> {
    let consumer: BaseConsumer = client_config(kafka).create()?;
    let md = consumer.fetch_metadata(Some(topic), Duration::from_secs(10))?;
    let t = md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .ok_or_else(|| ReadError::NoSuchTopic(topic.to_string()))?;
    let mut out = std::collections::HashMap::new();
    for p in t.partitions() {
        let (_, high) = consumer.fetch_watermarks(topic, p.id(), Duration::from_secs(10))?;
        out.insert(p.id(), high);
    }
    Ok(out)
}
