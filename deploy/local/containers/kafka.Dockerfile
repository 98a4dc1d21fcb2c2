# Apache Kafka for deploy/compose.yaml on a machine without registries (deploy/local/image.sh
# compose): Debian's Java and the jars deploy/local/kafka.sh gathers with Maven, taking the same
# KAFKA_* environment as the apache/kafka image the compose file names.
FROM debian:bookworm-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends openjdk-17-jre-headless \
 && rm -rf /var/lib/apt/lists/*
COPY libs/ /opt/kafka/libs/
COPY kafka-entry.sh /opt/kafka/bin/kafka-entry.sh
RUN ln -s kafka-entry.sh /opt/kafka/bin/kafka-topics.sh \
 && ln -s kafka-entry.sh /opt/kafka/bin/kafka-broker-api-versions.sh
ENTRYPOINT ["/opt/kafka/bin/kafka-entry.sh"]
