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

/// Creates `topic` with `partitions` partitions (replication factor 1 unless given), tolerating
/// an existing topic.
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
