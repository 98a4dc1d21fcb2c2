//! Kafka client factories: every client the service makes starts from [`client_config`], so
//! security settings and pass-through properties apply everywhere alike. The settings they read,
//! the `[kafka]` section ([`KafkaConfig`]), are `connection.rs`.

mod connection;
mod partitioner;

pub use connection::{is_secret_property, KafkaConfig, SecurityProtocol};
pub use partitioner::{is_home, InputPartitioner};

use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::producer::Producer as _;
use rdkafka::ClientConfig;

/// How long a client waits for a broker's answer before it gives up on that broker and asks
/// another (the next leader or coordinator). librdkafka's default is 60 s: a node that hangs or is
/// cut off then held every call to it that long, which was most of what a broker fault cost
/// (docs/testing.md, the fault table). A healthy broker answers in milliseconds, and a leader's
/// move takes the cluster about 9 s to decide, so 10 s costs nothing when all is well.
/// `kafka.properties` can set it.
pub const SOCKET_TIMEOUT_MS: &str = "10000";

/// How long a new connection may take to be usable (TCP, TLS, SASL and the API versions query)
/// before the client drops it and tries again, looking a coordinator up anew. librdkafka's default
/// is 30 s, Kafka's Java clients' 10 s. A hung node accepts connections (its kernel does) and
/// answers nothing: a producer made while the cluster still names the hung node its coordinator
/// (up to 16 s after the hang when the node is also the KRaft controller) waited this long on it
/// after the coordinator had moved. A healthy broker sets a connection up in milliseconds, TLS and
/// SCRAM included. `kafka.properties` can set it.
pub const CONNECTION_SETUP_TIMEOUT_MS: &str = "3000";

/// How often a client looks up the leaders of the partitions it uses (librdkafka's default is
/// five minutes). A node that hangs or is cut off answers nothing, not "not the leader", so a
/// client learns that the cluster moved its leaderships elsewhere (about 9 s after the node went
/// silent) only from a lookup: until then its records wait for the old leader. One small metadata
/// request per client every 3 s. `kafka.properties` can set it.
pub const METADATA_REFRESH_MS: &str = "3000";

/// The longest wait between two attempts to connect to a node that refuses or drops connections
/// (librdkafka doubles it from 100 ms up to this; its default is 10 s, Kafka's Java clients use
/// 1 s). A transactional producer looks its coordinator up again only when its connection to the
/// coordinator fails anew, so after a node's death the wait grew to 6-10 s just as the cluster
/// moved the coordinator (about 9 s after the death): the next commit or offsets call waited that
/// much longer for a coordinator that had long been elsewhere. `kafka.properties` can set it.
pub const RECONNECT_BACKOFF_MAX_MS: &str = "1000";

/// The base configuration of every Kafka client: brokers, security, timeouts, pass-through
/// properties.
pub fn client_config(kafka: &KafkaConfig) -> ClientConfig {
    let mut cfg = ClientConfig::new();
    cfg.set("bootstrap.servers", &kafka.brokers);
    cfg.set("socket.timeout.ms", SOCKET_TIMEOUT_MS);
    cfg.set(
        "socket.connection.setup.timeout.ms",
        CONNECTION_SETUP_TIMEOUT_MS,
    );
    cfg.set("topic.metadata.refresh.interval.ms", METADATA_REFRESH_MS);
    cfg.set("reconnect.backoff.max.ms", RECONNECT_BACKOFF_MAX_MS);
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
    if let Some(ca) = &kafka.ssl_ca_location {
        cfg.set("ssl.ca.location", ca.to_string_lossy());
    }
    for (k, v) in &kafka.properties {
        cfg.set(k, v);
    }
    cfg
}

/// The brokers refused this client at the security layer: retrying with the same settings fails
/// the same way. Named from librdkafka's error events, which never carry the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityFailure {
    #[error("SASL authentication failed ({0}); check kafka.sasl_mechanism, kafka.sasl_username and the password in DEDUPE_KAFKA_SASL_PASSWORD")]
    Authentication(String),
    #[error("the TLS handshake failed ({0}); check kafka.ssl_ca_location (the CA that signed the brokers' certificates) and that the port speaks TLS")]
    Tls(String),
    #[error("the broker closed the connection before it answered ({0}); its port may require TLS or SASL: check kafka.security_protocol")]
    Protocol(String),
}

/// A connection the broker closed during the client's first request (ApiVersion), as a port
/// that speaks TLS closes a plaintext client's. librdkafka logs it ("Disconnected ... in state
/// APIVERSION_QUERY") without an error event; a broker going down can close one that way too,
/// so it only names the failure when no broker could be asked at all.
fn closed_during_first_request(message: &str) -> bool {
    message.contains("Disconnected") && message.contains("in state APIVERSION_QUERY")
}

impl SecurityFailure {
    /// The failure an error event names, if it is one.
    pub fn classify(error: &KafkaError, reason: &str) -> Option<Self> {
        use rdkafka::types::RDKafkaErrorCode as Code;
        let what = if reason.is_empty() {
            error.to_string()
        } else {
            reason.to_string()
        };
        match error.rdkafka_error_code() {
            Some(Code::Authentication | Code::SaslAuthenticationFailed) => {
                Some(Self::Authentication(what))
            }
            Some(Code::SSL) => Some(Self::Tls(what)),
            // librdkafka's hint for a connection closed during the first request (ApiVersion):
            // "might be caused by incorrect security.protocol configuration (connecting to a SSL
            // listener?)".
            _ if reason.contains("security.protocol") => Some(Self::Protocol(what)),
            _ => None,
        }
    }
}

/// A client context that logs librdkafka's client-wide errors and keeps the first one that is a
/// [`SecurityFailure`].
#[derive(Default)]
pub struct SecurityWatch {
    first: std::sync::Mutex<Option<SecurityFailure>>,
    /// A connection closed during the first request: the likely cause when nothing answers.
    closed_early: std::sync::Mutex<Option<String>>,
    all_brokers_down: std::sync::atomic::AtomicBool,
}

impl SecurityWatch {
    pub fn failure(&self) -> Option<SecurityFailure> {
        self.first.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The failure that explains why no broker answered: a named one, else a connection every
    /// broker closed during the first request.
    pub fn likely_failure(&self) -> Option<SecurityFailure> {
        self.failure().or_else(|| {
            self.closed_early
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone()
                .map(SecurityFailure::Protocol)
        })
    }

    /// Whether librdkafka said that no broker could be reached at all.
    pub fn all_brokers_down(&self) -> bool {
        self.all_brokers_down
            .load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl rdkafka::ClientContext for SecurityWatch {
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        if closed_during_first_request(message) {
            self.closed_early
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert_with(|| message.to_string());
        }
        crate::metrics::events::KafkaClientLog {
            level,
            facility: fac,
            message,
        }
        .emit();
    }

    fn error(&self, error: KafkaError, reason: &str) {
        if let Some(failure) = SecurityFailure::classify(&error, reason) {
            self.first
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(failure);
        }
        if error.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::AllBrokersDown) {
            self.all_brokers_down
                .store(true, std::sync::atomic::Ordering::Relaxed);
        }
        crate::metrics::events::KafkaClientError {
            role: crate::metrics::events::ClientRole::Client,
            error: &error,
            reason,
        }
        .emit();
    }
}

impl rdkafka::producer::ProducerContext for SecurityWatch {
    type DeliveryOpaque = ();

    fn delivery(&self, _: &rdkafka::producer::DeliveryResult<'_>, _: ()) {}
}

/// The context of a consumer that reads partitions to their end (`enable.partition.eof`):
/// librdkafka reports the end of a partition as an error event, and reaching it is how such a
/// reader knows it is done, so it is logged at debug, not as an error.
pub struct ReaderContext;

impl rdkafka::ClientContext for ReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if is_partition_eof(&error) {
            tracing::debug!(reason, "A reader reached the end of a partition.");
        } else {
            crate::metrics::events::KafkaClientError {
                role: crate::metrics::events::ClientRole::Reader,
                error: &error,
                reason,
            }
            .emit();
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// A consumer that reads partitions to their end.
pub type Reader = BaseConsumer<ReaderContext>;

/// Whether `e` is librdkafka's end-of-partition event.
pub fn is_partition_eof(e: &KafkaError) -> bool {
    matches!(e, KafkaError::PartitionEOF(_))
        || e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::PartitionEOF)
}

/// Why the brokers could not be asked.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error(transparent)]
    Security(#[from] SecurityFailure),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// Fetches metadata (of `topic`, or of the cluster), in steps of at most a second so that a
/// security failure ends the wait as soon as librdkafka reports it.
/// With `until_all_down`, it also gives up (with the last error) once no broker could be reached.
fn watched_metadata(
    kafka: &KafkaConfig,
    topic: Option<&str>,
    timeout: Duration,
    until_all_down: bool,
) -> Result<rdkafka::metadata::Metadata, ConnectError> {
    // A producer (that sends nothing): its poll serves the main queue, where librdkafka puts its
    // error and log events. Info: a connection closed during the first request is logged at
    // that level only.
    let client: rdkafka::producer::BaseProducer<SecurityWatch> = client_config(kafka)
        .set_log_level(rdkafka::config::RDKafkaLogLevel::Info)
        .create_with_context(SecurityWatch::default())?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let step = deadline
            .saturating_duration_since(std::time::Instant::now())
            .min(Duration::from_secs(1));
        let result = client.client().fetch_metadata(topic, step);
        client.poll(Duration::from_millis(50));
        let watch = client.context();
        if let Some(failure) = watch.failure() {
            return Err(failure.into());
        }
        let gave_up =
            std::time::Instant::now() >= deadline || (until_all_down && watch.all_brokers_down());
        match result {
            Ok(md) => return Ok(md),
            Err(e) if gave_up => {
                return Err(watch.likely_failure().map_or(e.into(), ConnectError::from))
            }
            Err(_) => {}
        }
    }
}

/// Asks the brokers for the cluster's metadata and fails only on a [`SecurityFailure`]: for a
/// command that rides out unreachable brokers but must not run with settings that can never
/// connect. Waits at most `timeout`, and not once every broker refused the connection.
pub fn check_security(kafka: &KafkaConfig, timeout: Duration) -> Result<(), SecurityFailure> {
    match watched_metadata(kafka, None, timeout, true) {
        Err(ConnectError::Security(failure)) => Err(failure),
        _ => Ok(()),
    }
}

/// Whether `e` is a cluster's passing state that the same request meets no more once
/// leaderships settle: a leader that moved or died, a node that cannot be reached for now, a
/// request that timed out. A reader asks again instead of failing its caller.
pub fn is_transient(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::NotLeaderForPartition
                | C::LeaderNotAvailable
                | C::FencedLeaderEpoch
                | C::UnknownLeaderEpoch
                | C::NotEnoughReplicas
                | C::NotEnoughReplicasAfterAppend
                | C::OffsetNotAvailable
                | C::BrokerTransportFailure
                | C::AllBrokersDown
                | C::OperationTimedOut
                | C::RequestTimedOut
                | C::KafkaStorageError
        )
    )
}

/// Whether `e` is the group coordinator refusing a reader's group: readers assign their
/// partitions and offsets themselves and commit nothing, so librdkafka's lookup of their group's
/// coordinator (which every consumer with a `group.id` makes, and `assign` needs the id) may fail
/// without harm. A principal then needs no ACL on the readers' throw-away groups.
pub fn is_reader_group_refusal(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::GroupAuthorizationFailed)
}

/// The number of partitions of `topic`, or `None` if the topic does not exist.
pub fn partition_count(
    kafka: &KafkaConfig,
    topic: &str,
    timeout: Duration,
) -> Result<Option<usize>, ConnectError> {
    let md = watched_metadata(kafka, Some(topic), timeout, false)?;
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

/// One of the topic's millisecond settings (`retention.ms`, `segment.ms`), or `None` when the
/// brokers do not say.
pub async fn topic_setting_ms(
    kafka: &KafkaConfig,
    topic: &str,
    name: &str,
) -> Result<Option<i64>, KafkaError> {
    Ok(topic_setting(kafka, topic, name)
        .await?
        .and_then(|v| v.parse().ok()))
}

/// The topic's `max.message.bytes`: the largest record batch its brokers accept (Kafka's
/// default is 1 MiB and 12 bytes), or `None` when the broker does not say.
pub async fn topic_max_message_bytes(
    kafka: &KafkaConfig,
    topic: &str,
) -> Result<Option<u64>, KafkaError> {
    Ok(topic_setting(kafka, topic, "max.message.bytes")
        .await?
        .and_then(|v| v.parse().ok()))
}

/// One of the topic's settings as the brokers describe it, or `None` when they do not say.
async fn topic_setting(
    kafka: &KafkaConfig,
    topic: &str,
    name: &str,
) -> Result<Option<String>, KafkaError> {
    let admin: AdminClient<DefaultClientContext> = client_config(kafka).create()?;
    let opts = AdminOptions::new().request_timeout(Some(Duration::from_secs(30)));
    let results = admin
        .describe_configs([&rdkafka::admin::ResourceSpecifier::Topic(topic)], &opts)
        .await?;
    for result in results {
        let resource = result.map_err(KafkaError::AdminOp)?;
        if let Some(value) = resource.get(name).and_then(|e| e.value.as_deref()) {
            return Ok(Some(value.to_string()));
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
    read_from(
        kafka,
        topic,
        read_committed,
        &std::collections::HashMap::new(),
        timeout,
        each,
    )
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
    let md = watched_metadata(kafka, Some(topic), Duration::from_secs(10), false)?;
    let consumer: Reader = client_config(kafka)
        .set(
            "group.id",
            format!("dedupe-reader-{}", uuid::Uuid::new_v4().simple()),
        )
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set(
            "isolation.level",
            if read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        )
        .create_with_context(ReaderContext)?;
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
        let offset = start
            .get(p)
            .map(|o| Offset::Offset(*o))
            .unwrap_or(Offset::Beginning);
        tpl.add_partition_offset(topic, *p, offset)?;
    }
    consumer.assign(&tpl)?;
    let mut at_end: std::collections::HashMap<i32, bool> =
        parts.iter().map(|p| (*p, false)).collect();
    let deadline = std::time::Instant::now() + timeout;
    let mut n = 0;
    while at_end.values().any(|e| !e) {
        if std::time::Instant::now() > deadline {
            return Err(ReadError::Timeout {
                topic: topic.to_string(),
                seconds: timeout.as_secs(),
            });
        }
        match consumer.poll(Duration::from_millis(200)) {
            None => {}
            Some(Err(KafkaError::PartitionEOF(p))) => {
                at_end.insert(p, true);
            }
            Some(Err(e)) if is_reader_group_refusal(&e) => {}
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
    #[error(transparent)]
    Security(#[from] SecurityFailure),
}

impl From<ConnectError> for ReadError {
    fn from(e: ConnectError) -> Self {
        match e {
            ConnectError::Security(f) => Self::Security(f),
            ConnectError::Kafka(k) => Self::Kafka(k),
        }
    }
}

/// High watermarks of every partition of `topic`.
pub fn high_watermarks(
    kafka: &KafkaConfig,
    topic: &str,
) -> Result<std::collections::HashMap<i32, i64>, ReadError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::types::RDKafkaErrorCode;

    #[test]
    fn the_end_of_a_partition_is_told_apart_from_errors() {
        // As a consumer poll returns it, and as librdkafka's error event carries it.
        assert!(is_partition_eof(&KafkaError::PartitionEOF(3)));
        assert!(is_partition_eof(&KafkaError::Global(
            RDKafkaErrorCode::PartitionEOF
        )));
        // Real errors are not.
        assert!(!is_partition_eof(&KafkaError::Global(
            RDKafkaErrorCode::AllBrokersDown
        )));
        assert!(!is_partition_eof(&KafkaError::MessageConsumption(
            RDKafkaErrorCode::UnknownTopicOrPartition
        )));
    }
}
