#!/usr/bin/env bash
# Runs one real Apache Kafka broker (KRaft, broker and controller in one JVM) on loopback for the
# local run, the integration tests and the benches.
#
#   deploy/local/kafka.sh up       gather the jars (Maven), format storage, start, wait until ready
#   deploy/local/kafka.sh down     stop the broker this script started (by its pid file)
#   deploy/local/kafka.sh status   say whether it runs and where
#   deploy/local/kafka.sh classpath  print the classpath (for Kafka's own tools in tests and benches)
#   deploy/local/kafka.sh create-topic NAME PARTITIONS [CONFIG=VALUE ...]
#                                  create a topic (idempotent) with Kafka's own TopicCommand
#
# Environment:
#   KAFKA_PORT       client port (default 9092); the controller listens on KAFKA_PORT+1
#   KAFKA_VERSION    Apache Kafka version gathered from Maven (default: the pom's)
#   DEDUPE_CACHE     where jars are cached (default ~/.cache/dedupe)
#   KAFKA_RUN_DIR    data, logs and pid file (default ${TMPDIR:-/tmp}/dedupe-kafka-$KAFKA_PORT)
#   KAFKA_HEAP_OPTS  JVM heap (default -Xms256m -Xmx512m)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
port=${KAFKA_PORT:-9092}
controller_port=$((port + 1))
version=${KAFKA_VERSION:-$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$here/pom.xml")}
cache=${DEDUPE_CACHE:-$HOME/.cache/dedupe}
# The cache is keyed by the version and the pom's content, so a changed pom gathers anew.
pom_hash=$(sha256sum "$here/pom.xml" | cut -c1-12)
libs="$cache/kafka-$version-$pom_hash/libs"
run_dir=${KAFKA_RUN_DIR:-${TMPDIR:-/tmp}/dedupe-kafka-$port}
pid_file="$run_dir/kafka.pid"
bootstrap="127.0.0.1:$port"

die() { echo "kafka.sh: $*" >&2; exit 1; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed: $2"
}

running_pid() {
  [ -f "$pid_file" ] || return 1
  local pid
  pid=$(cat "$pid_file")
  kill -0 "$pid" 2>/dev/null || return 1
  echo "$pid"
}

answers_metadata() {
  kcat -b "$bootstrap" -L -m 5 >/dev/null 2>&1
}

gather() {
  if [ -f "$libs/.complete" ]; then return 0; fi
  need mvn "Maven gathers Apache Kafka's jars (apt-get install maven)"
  need java "the broker runs on Java 17 (apt-get install openjdk-17-jre-headless)"
  echo "kafka.sh: gathering Apache Kafka $version with Maven into $libs" >&2
  rm -rf "$libs.tmp"
  mkdir -p "$libs.tmp"
  if ! mvn -B -q -f "$here/pom.xml" -Dkafka.version="$version" \
      dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory="$libs.tmp" >"$cache/mvn-$version.log" 2>&1; then
    tail -n 30 "$cache/mvn-$version.log" >&2
    die "could not gather org.apache.kafka:kafka_2.13:$version and its dependencies from Maven (log: $cache/mvn-$version.log)"
  fi
  ls "$libs.tmp"/kafka_2.13-"$version".jar >/dev/null 2>&1 \
    || die "Maven finished but kafka_2.13-$version.jar is missing from $libs.tmp"
  ls "$libs.tmp"/kafka-tools-"$version".jar >/dev/null 2>&1 \
    || die "Maven finished but kafka-tools-$version.jar is missing from $libs.tmp"
  rm -rf "$libs"
  mv "$libs.tmp" "$libs"
  touch "$libs/.complete"
}

classpath() {
  local cp="" jar
  for jar in "$libs"/*.jar; do cp="${cp:+$cp:}$jar"; done
  echo "$cp"
}

write_config() {
  mkdir -p "$run_dir/data"
  cat >"$run_dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$controller_port
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$controller_port
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$run_dir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=4
group.initial.rebalance.delay.ms=0
# The consumer group protocol (KIP-848) of worker.assignment = "group": a member that dies is
# replaced after the session timeout. Kafka's defaults (45 s, heartbeats every 5 s) suit
# production; the local broker moves partitions faster so the tests and benches run quickly.
group.consumer.min.session.timeout.ms=6000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
auto.create.topics.enable=false
delete.topic.enable=true
log.retention.hours=168
PROPS
}

up() {
  need kcat "kcat checks that the broker answers metadata requests (apt-get install kcat)"
  # Test processes started side by side may each call `up`: one starts the broker, the others
  # wait for it and find it running.
  exec 9>"${TMPDIR:-/tmp}/dedupe-kafka-$port.lock"
  flock 9
  if pid=$(running_pid) && answers_metadata; then
    echo "kafka.sh: broker already running (pid $pid) at $bootstrap"
    echo "$bootstrap"
    return 0
  fi
  if answers_metadata; then
    die "something else already answers on $bootstrap; stop it or set KAFKA_PORT"
  fi
  gather
  rm -rf "$run_dir"
  write_config
  local cp cluster_id
  cp=$(classpath)
  local jvm=(java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} -XX:+UseG1GC -Djava.awt.headless=true
    "-Dlog4j2.configurationFile=$here/log4j2-broker.properties" "-Ddedupe.broker.log=$run_dir/server.log" -cp "$cp")
  cluster_id=$("${jvm[@]}" kafka.tools.StorageTool random-uuid 2>"$run_dir/format.err") \
    || { cat "$run_dir/format.err" >&2; die "StorageTool random-uuid failed"; }
  "${jvm[@]}" kafka.tools.StorageTool format -t "$cluster_id" -c "$run_dir/server.properties" \
    >"$run_dir/format.log" 2>&1 || { cat "$run_dir/format.log" >&2; die "formatting KRaft storage in $run_dir/data failed"; }
  setsid nohup "${jvm[@]}" kafka.Kafka "$run_dir/server.properties" >"$run_dir/stdout.log" 2>&1 </dev/null 9>&- &
  echo $! >"$pid_file"
  local deadline=$((SECONDS + ${KAFKA_START_TIMEOUT:-90}))
  until answers_metadata; do
    if ! running_pid >/dev/null; then
      tail -n 40 "$run_dir/stdout.log" "$run_dir/server.log" >&2 2>/dev/null || true
      die "the broker exited during start (logs in $run_dir)"
    fi
    [ $SECONDS -lt $deadline ] || die "the broker did not answer metadata requests on $bootstrap within ${KAFKA_START_TIMEOUT:-90}s (logs in $run_dir)"
    sleep 0.5
  done
  echo "kafka.sh: Apache Kafka $version started (pid $(cat "$pid_file")) at $bootstrap, data in $run_dir"
  echo "$bootstrap"
}

down() {
  local pid
  if ! pid=$(running_pid); then
    echo "kafka.sh: no broker started by this script runs on port $port"
    rm -f "$pid_file"
    return 0
  fi
  kill "$pid"
  for _ in $(seq 1 60); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.5
  done
  if kill -0 "$pid" 2>/dev/null; then
    echo "kafka.sh: broker $pid ignored SIGTERM for 30s; sending SIGKILL" >&2
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -rf "$run_dir"
  echo "kafka.sh: broker $pid stopped"
}

status() {
  local pid
  if pid=$(running_pid); then
    if answers_metadata; then
      echo "running: Apache Kafka $version, pid $pid, bootstrap $bootstrap, data $run_dir"
    else
      echo "starting or unhealthy: pid $pid runs but $bootstrap does not answer metadata requests"
      return 1
    fi
  else
    echo "stopped: no broker started by this script on port $port"
    return 3
  fi
}

create_topic() {
  local name=${1:?topic name} partitions=${2:?partition count}
  shift 2
  local configs=() kv
  for kv in "$@"; do configs+=(--config "$kv"); done
  gather
  java -Xmx256m "-Dlog4j2.configurationFile=$here/log4j2-tools.properties" -cp "$(classpath)" \
    org.apache.kafka.tools.TopicCommand --bootstrap-server "$bootstrap" --create --if-not-exists \
    --topic "$name" --partitions "$partitions" --replication-factor 1 ${configs[@]+"${configs[@]}"}
}

case "${1:-}" in
  up) up ;;
  create-topic) shift; create_topic "$@" ;;
  down) down ;;
  status) status ;;
  classpath) gather; classpath ;;
  *) echo "usage: $0 up|down|status|classpath|create-topic NAME PARTITIONS [CONFIG=VALUE ...]" >&2; exit 2 ;;
esac
