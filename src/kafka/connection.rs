//! The `[kafka]` section of the configuration (named `dedupe::config::KafkaConfig` there too): how
//! every client the service makes reaches the cluster, and which librdkafka properties are secrets
//! that never print. It lives with the client factories that read it, below `config`.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize, Serializer};

use crate::secret::Secret;

/// Kafka connection settings shared by every client the service makes.
#[derive(Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma separated (`bootstrap.servers`).
    pub brokers: String,
    /// `security.protocol`: plaintext, ssl, sasl_plaintext or sasl_ssl.
    pub security_protocol: SecurityProtocol,
    /// `sasl.mechanisms` when SASL is used (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512).
    pub sasl_mechanism: Option<String>,
    /// `sasl.username` when SASL is used.
    pub sasl_username: Option<String>,
    /// `sasl.password`: from `DEDUPE_KAFKA_SASL_PASSWORD` only; never in a file.
    #[serde(skip_deserializing)]
    pub sasl_password: Option<Secret>,
    /// `ssl.ca.location`: the PEM file of the CA that signed the brokers' certificates (with
    /// `ssl` or `sasl_ssl`; without it, the system's CA store).
    pub ssl_ca_location: Option<std::path::PathBuf>,
    /// Extra librdkafka properties passed through as given (e.g. `"ssl.ca.location"`). Values of
    /// secret-looking properties ([`is_secret_property`]) print as `<redacted>`.
    #[serde(serialize_with = "serialize_properties")]
    pub properties: BTreeMap<String, String>,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        Self {
            // The local broker that deploy/local/kafka.sh starts.
            brokers: "127.0.0.1:9092".into(),
            // librdkafka's default security.protocol.
            security_protocol: SecurityProtocol::Plaintext,
            // No SASL unless asked for.
            sasl_mechanism: None,
            sasl_username: None,
            sasl_password: None,
            // The system's CA store.
            ssl_ca_location: None,
            // librdkafka's own defaults for everything else.
            properties: BTreeMap::new(),
        }
    }
}

/// Prints the names of `properties` only, never their values, and the password as `<redacted>`.
impl fmt::Debug for KafkaConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KafkaConfig")
            .field("brokers", &self.brokers)
            .field("security_protocol", &self.security_protocol)
            .field("sasl_mechanism", &self.sasl_mechanism)
            .field("sasl_username", &self.sasl_username)
            .field("sasl_password", &self.sasl_password)
            .field("ssl_ca_location", &self.ssl_ca_location)
            .field("properties", &self.properties.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// `security.protocol` values librdkafka accepts.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    /// No TLS, no SASL.
    Plaintext,
    /// TLS, no SASL.
    Ssl,
    /// SASL without TLS.
    SaslPlaintext,
    /// SASL over TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Whether the protocol authenticates with SASL.
    pub fn uses_sasl(self) -> bool {
        matches!(self, Self::SaslPlaintext | Self::SaslSsl)
    }

    /// Whether the protocol runs over TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, Self::Ssl | Self::SaslSsl)
    }

    /// The value of librdkafka's `security.protocol` property.
    pub fn as_librdkafka(self) -> &'static str {
        match self {
            Self::Plaintext => "plaintext",
            Self::Ssl => "ssl",
            Self::SaslPlaintext => "sasl_plaintext",
            Self::SaslSsl => "sasl_ssl",
        }
    }
}

/// Whether a librdkafka property holds a secret (`sasl.password`, `ssl.key.password`,
/// `ssl.keystore.password`, `ssl.key.pem`, `sasl.oauthbearer.client.secret`, ...): its value is
/// never printed.
pub fn is_secret_property(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "password",
        "secret",
        "key.pem",
        "oauthbearer.config",
        "jaas",
        "token",
        "credential",
    ]
    .iter()
    .any(|word| name.contains(word))
}

/// Writes `properties` with the values of secret properties replaced by `<redacted>`.
fn serialize_properties<S: Serializer>(
    properties: &BTreeMap<String, String>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeMap;
    let mut map = s.serialize_map(Some(properties.len()))?;
    for (name, value) in properties {
        let shown = if is_secret_property(name) {
            "<redacted>"
        } else {
            value.as_str()
        };
        map.serialize_entry(name, shown)?;
    }
    map.end()
}
