#!/bin/bash
# The broker (as the entrypoint) or, by the name it is called with, the two Kafka tools
# deploy/compose.yaml runs: kafka-topics.sh and kafka-broker-api-versions.sh.
set -euo pipefail
cp='/opt/kafka/libs/*'
case "$(basename "$0")" in
  kafka-topics.sh) exec java -Xmx256m -cp "$cp" org.apache.kafka.tools.TopicCommand "$@" ;;
  kafka-broker-api-versions.sh) exec java -Xmx256m -cp "$cp" org.apache.kafka.tools.BrokerApiVersionsCommand "$@" ;;
esac
# KAFKA_NODE_ID=1 becomes node.id=1, as in the apache/kafka image; KAFKA_HEAP_OPTS is the JVM's.
props=/tmp/server.properties
: >"$props"
while IFS='=' read -r name value; do
  case "$name" in
    KAFKA_HEAP_OPTS) ;;
    KAFKA_*) key=${name#KAFKA_}; key=${key,,}; echo "${key//_/.}=$value" >>"$props" ;;
  esac
done < <(env)
echo "log.dirs=/var/lib/kafka/data" >>"$props"
mkdir -p /var/lib/kafka/data
# shellcheck disable=SC2086
jvm=(java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} -cp "$cp")
"${jvm[@]}" kafka.tools.StorageTool format -t "$("${jvm[@]}" kafka.tools.StorageTool random-uuid)" -c "$props" --ignore-formatted
exec "${jvm[@]}" kafka.Kafka "$props"
