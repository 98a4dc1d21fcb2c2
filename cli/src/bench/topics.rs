//! The topics a bench makes for its run, on a random name each, and deletes after it.

use anyhow::Context as _;
use dedupe::config::Config;
use tokio::runtime::Runtime;

/// A bench's topics, created at its start; [`BenchTopics::delete`] removes them.
pub struct BenchTopics<'a> {
    config: &'a Config,
    rt: Runtime,
    names: Vec<String>,
}

impl<'a> BenchTopics<'a> {
    /// Creates each of `names` with `partitions` partitions, one replica and `topic_config`.
    pub fn create(
        config: &'a Config,
        names: &[&str],
        partitions: i32,
        topic_config: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        for topic in names {
            rt.block_on(dedupe::kafka::create_topic(
                &config.kafka,
                topic,
                partitions,
                1,
                topic_config,
            ))
            .with_context(|| format!("creating {topic}"))?;
        }
        Ok(Self {
            config,
            rt,
            names: names.iter().map(|n| n.to_string()).collect(),
        })
    }

    /// Deletes the bench's topics and `also` (topics the worker made for itself); a failure is
    /// said on stderr, and does not fail the bench, whose figures are already measured.
    pub fn delete(self, also: &[&str]) {
        let mut names: Vec<&str> = self.names.iter().map(String::as_str).collect();
        names.extend_from_slice(also);
        let deleted: Result<(), rdkafka::error::KafkaError> = self.rt.block_on(async {
            let admin: rdkafka::admin::AdminClient<rdkafka::client::DefaultClientContext> =
                dedupe::kafka::client_config(&self.config.kafka).create()?;
            admin
                .delete_topics(&names, &rdkafka::admin::AdminOptions::new())
                .await?;
            Ok(())
        });
        if let Err(e) = deleted {
            eprintln!("bench: could not delete the bench topics: {e}");
        }
    }
}
