#!/usr/bin/env bash
# A local THREE-node Apache Kafka KRaft cluster on loopback for fault tests: each node is broker
# and controller in one JVM; topics have 3 replicas, min.insync.replicas=2. This script starts,
# stops, signals and networks the nodes; the tests ask Kafka itself who leads what.
#
#   up          make the TLS material, format and start the nodes, wait for 3 brokers in the
#               metadata (a healthy cluster set up the same way is kept)
#   down        SIGTERM every node (SIGKILL after 30 s), remove the namespace and the run dir
#   kill|stop N SIGKILL (a crash) | SIGTERM (controlled shutdown) node N; waits until it is gone
#   start N     start node N on its data; waits until it lists itself among the brokers
#   pause|resume N   SIGSTOP (a hang) | SIGCONT node N
#   cut|heal N  add | remove a blackhole route from the namespace to node N (connections hang)
#
# Node N has ports P = CLUSTER_BASE_PORT+10*(N-1): P PLAINTEXT (User:ANONYMOUS, a super user),
# P+1 controller, P+2 SASL_SSL (SCRAM-SHA-512 users `dedupe` and `dedupe-client`, password in
# RUN_DIR/tls/scram.password, CA RUN_DIR/tls/ca.pem, ACLs enforced), and with CLUSTER_NETNS P+3
# PLAINTEXT on SUBNET.1N for the namespace (at SUBNET.2). Data and logs: RUN_DIR/nodeN.
# Environment: CLUSTER_BASE_PORT (29092), CLUSTER_RUN_DIR (${TMPDIR:-/tmp}/dedupe-cluster-PORT),
# CLUSTER_START_TIMEOUT (120 s), CLUSTER_NETNS (made by `up`, root only), CLUSTER_NETNS_SUBNET
# (10.213.0), KAFKA_HEAP_OPTS (-Xms256m -Xmx512m); KAFKA_VERSION, DEDUPE_CACHE for kafka.sh.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base=${CLUSTER_BASE_PORT:-29092}
die() { echo "cluster.sh: $*" >&2; exit 1; }
[[ $base =~ ^[0-9]+$ ]] && [ "$base" -ge 1024 ] && [ "$base" -le 65500 ] || die "CLUSTER_BASE_PORT must be a port between 1024 and 65500, not '$base'"
run_dir=${CLUSTER_RUN_DIR:-${TMPDIR:-/tmp}/dedupe-cluster-$base}
# Absolute, so the pid check (which matches the JVM's command line) works from any directory.
[[ $run_dir = /* ]] || run_dir="$PWD/$run_dir"
start_timeout=${CLUSTER_START_TIMEOUT:-120}
netns=${CLUSTER_NETNS:-}
[ -z "$netns" ] || [[ $netns =~ ^[A-Za-z0-9_-]{1,32}$ ]] || die "CLUSTER_NETNS must be letters, digits, - and _, not '$netns'"
subnet=${CLUSTER_NETNS_SUBNET:-10.213.0}
[[ $subnet =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "CLUSTER_NETNS_SUBNET must be the first three octets of a /24, not '$subnet'"
veth_host="dk${base}h" veth_ns="dk${base}n"
nodes=(1 2 3)

need() { command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed: $2"; }
port() { echo $((base + 10 * ($1 - 1) + $2)); }
node_dir() { echo "$run_dir/node$1"; }
check_node() { [[ ${1:-} =~ ^[123]$ ]] || die "expected a node number 1, 2 or 3, not '${1:-}'"; }
list() { local n out=""; for n in "${nodes[@]}"; do out="${out:+$out,}$("$@" "$n")"; done; echo "$out"; }
client_addr() { echo "127.0.0.1:$(port "$1" 0)"; }
voter() { echo "$1@127.0.0.1:$(port "$1" 1)"; }
# What `up` configures beyond the fixed settings; a cluster set up otherwise is restarted.
layout() { echo "layout 3 (sasl_ssl, acls) netns=${netns:+$netns $subnet.0/24}"; }
made_netns() { cat "$run_dir/netns" 2>/dev/null || true; }

# The pid of node N's JVM if it runs (paused or not): the pid file's process must still be the
# java started with this node's server.properties (not a reused pid, not a zombie).
running_pid() {
  local f pid
  f="$(node_dir "$1")/kafka.pid"
  [ -f "$f" ] && pid=$(cat "$f") && [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(node_dir "$1")/server.properties" || return 1
  echo "$pid"
}
proc_state() { local s; s=$(cat "/proc/$1/stat" 2>/dev/null) || return 1; s=${s##*) }; echo "${s%% *}"; }
is_paused() { local s; s=$(proc_state "$1") || return 1; [ "$s" = T ] || [ "$s" = t ]; }
node_state() {
  local pid
  if ! pid=$(running_pid "$1"); then echo stopped; elif is_paused "$pid"; then echo paused; else echo running; fi
}
states() { local n; for n in "${nodes[@]}"; do printf '%s=%s ' "$n" "$(node_state "$n")"; done; }
port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
# Waits up to $2 s for nothing to listen on port $1 (sockets can outlive the pid by a little).
wait_port_free() { local d=$((SECONDS + $2)); while port_in_use "$1"; do [ $SECONDS -lt $d ] || return 1; sleep 0.2; done; }
# Waits up to $2 s for pid $1 to exit.
wait_gone() {
  local deadline=$((SECONDS + $2))
  while kill -0 "$1" 2>/dev/null && [ "$(proc_state "$1" || echo Z)" != Z ]; do
    [ $SECONDS -lt "$deadline" ] || return 1
    sleep 0.2
  done
}
broker_count() { kcat -b "$(list client_addr)" -L -J -m 5 2>/dev/null | jq '.brokers | length' 2>/dev/null || echo 0; }
# Whether the metadata node N serves on its own port lists node N among the (unfenced) brokers.
lists_itself() { kcat -b "$(client_addr "$1")" -L -J -m 5 2>/dev/null | jq -e --argjson id "$1" 'any(.brokers[]; .id == $id)' >/dev/null 2>&1; }
classpath() { [ -n "${cp:-}" ] || { cp=$("$here/kafka.sh" classpath) && [ -n "$cp" ]; } || die "could not gather Apache Kafka's jars (kafka.sh classpath)"; }
tool() { classpath; java -Xmx256m -XX:TieredStopAtLevel=1 "-Dlog4j2.configurationFile=$here/log4j2-tools.properties" -cp "$cp" "$@"; }
logs_hint() { tail -n 30 "$(node_dir "$1")/stdout.log" "$(node_dir "$1")/server.log" >&2 2>/dev/null || true; }

# A CA, a broker certificate for 127.0.0.1 in a PKCS12 keystore, its password and the SCRAM
# password, in $run_dir/tls (readable by this user only; the CA by everyone).
make_tls() {
  need openssl "it makes the cluster's CA and broker certificate (apt-get install openssl)"
  mkdir -p "$run_dir/tls" && chmod 700 "$run_dir/tls"
  (
    umask 077 && cd "$run_dir/tls"
    openssl rand -hex 16 >keystore.password && openssl rand -hex 16 >scram.password
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 -subj "/CN=dedupe test cluster CA" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj "/CN=localhost" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out broker.pem -days 30 -extfile broker.ext 2>/dev/null
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker -out broker.p12 -passout file:keystore.password
    chmod 644 ca.pem
  ) || die "making the TLS material in $run_dir/tls failed"
}

write_config() {
  local n=$1 dir listeners advertised map
  dir=$(node_dir "$n")
  mkdir -p "$dir/data"
  listeners="PLAINTEXT://$(client_addr "$n"),CONTROLLER://127.0.0.1:$(port "$n" 1),SASL_SSL://127.0.0.1:$(port "$n" 2)"
  advertised="PLAINTEXT://$(client_addr "$n"),SASL_SSL://127.0.0.1:$(port "$n" 2)"
  map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
  if [ -n "$netns" ]; then
    listeners="$listeners,EXTERNAL://$subnet.1$n:$(port "$n" 3)"
    advertised="$advertised,EXTERNAL://$subnet.1$n:$(port "$n" 3)"
    map="$map,EXTERNAL:PLAINTEXT"
  fi
  # One setting per argument, grouped by concern.
  printf '%s\n' >"$dir/server.properties" \
    process.roles=broker,controller "node.id=$n" "controller.quorum.voters=$(list voter)" \
    "listeners=$listeners" "advertised.listeners=$advertised" "listener.security.protocol.map=$map" \
    controller.listener.names=CONTROLLER inter.broker.listener.name=PLAINTEXT \
    sasl.enabled.mechanisms=SCRAM-SHA-512 ssl.client.auth=none ssl.keystore.type=PKCS12 \
    "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;" \
    "ssl.keystore.location=$run_dir/tls/broker.p12" "ssl.keystore.password=$(cat "$run_dir/tls/keystore.password")" \
    `# Only SASL users are limited by ACLs: the plaintext principal is a super user.` \
    authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer super.users=User:ANONYMOUS \
    allow.everyone.if.no.acl.found=false "log.dirs=$dir/data" log.retention.hours=168 \
    num.partitions=1 default.replication.factor=3 min.insync.replicas=2 unclean.leader.election.enable=false \
    auto.create.topics.enable=false delete.topic.enable=true controlled.shutdown.enable=true \
    `# 8 partitions each: tests/kit/src/cluster.rs places group and transactional ids with this count.` \
    offsets.topic.replication.factor=3 offsets.topic.num.partitions=8 \
    transaction.state.log.replication.factor=3 transaction.state.log.min.isr=2 transaction.state.log.num.partitions=8 \
    `# The consumer group protocol (KIP-848), as in kafka.sh: a dead member is replaced after 6 s.` \
    group.initial.rebalance.delay.ms=0 group.consumer.min.session.timeout.ms=6000 group.consumer.session.timeout.ms=6000 \
    group.consumer.min.heartbeat.interval.ms=500 group.consumer.heartbeat.interval.ms=1000 \
    `# The active controller fences a broker silent for 9 s and moves its leaderships.` \
    broker.session.timeout.ms=9000 broker.heartbeat.interval.ms=1000 \
    `# A coordinator's transaction markers sent to a hung node wait this long before they go to the` \
    `# node's successor (Kafka's default is 30 s); docs/operations.md recommends it for the brokers.` \
    request.timeout.ms=10000 \
    `# Fewer threads than Kafka's defaults: three nodes share 2 cores with the worker under test.` \
    num.network.threads=2 num.io.threads=2 background.threads=2 num.recovery.threads.per.data.dir=1
}

launch() {
  local dir jvm="" i
  dir=$(node_dir "$1")
  classpath
  # C1 only (TieredStopAtLevel=1): a node restarted under load starts in seconds instead of
  # competing with two others for the CPU its C2 compiler wants.
  # shellcheck disable=SC2086 # KAFKA_HEAP_OPTS holds several JVM options
  setsid nohup java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} -XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$here/log4j2-broker.properties" "-Ddedupe.broker.log=$dir/server.log" -cp "$cp" \
    kafka.Kafka "$dir/server.properties" >>"$dir/stdout.log" 2>&1 </dev/null &
  local pid=$!
  # setsid forks when its caller leads a process group, and then $! is not the JVM: record the
  # JVM's own pid, found by its command line (unique per node).
  for i in $(seq 1 50); do jvm=$(pgrep -n -f -- "kafka.Kafka $dir/server.properties") && break; sleep 0.1; done
  echo "${jvm:-$pid}" >"$dir/kafka.pid"
}

# SIGTERM node $1 (a paused node is resumed so it can shut down), then wait $2 s, then SIGKILL.
terminate() {
  local pid
  pid=$(running_pid "$1") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  kill -CONT "$pid" 2>/dev/null || true
  if ! wait_gone "$pid" "$2"; then
    echo "cluster.sh: node $1 (pid $pid) did not exit within $2 s of SIGTERM; sending SIGKILL" >&2
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "node $1 (pid $pid) survived SIGKILL"
  fi
  rm -f "$(node_dir "$1")/kafka.pid"
}

make_netns() {
  [ -n "$netns" ] || return 0
  need ip "ip (iproute2) makes the network namespace (apt-get install iproute2)"
  [ "$(id -u)" = 0 ] || die "CLUSTER_NETNS needs root: 'ip netns add' and veth pairs are privileged"
  remove_netns "$netns"
  ip netns add "$netns" && ip link add "$veth_host" type veth peer name "$veth_ns" && ip link set "$veth_ns" netns "$netns" \
    || die "making namespace $netns and its veth pair failed"
  local n; for n in "${nodes[@]}"; do ip addr add "$subnet.1$n/24" dev "$veth_host"; done
  ip link set "$veth_host" up && ip -n "$netns" addr add "$subnet.2/24" dev "$veth_ns"
  ip -n "$netns" link set "$veth_ns" up && ip -n "$netns" link set lo up
  echo "$netns" >"$run_dir/netns"
}

# Deleting the namespace deletes its end of the pair, and with it this host's end.
remove_netns() {
  [ -n "$1" ] || return 0
  ip netns list 2>/dev/null | grep -qE "^$1( |$)" && ip netns del "$1"
  ip link del "$veth_host" 2>/dev/null || true
}

up() {
  need kcat "kcat reads the cluster's metadata (apt-get install kcat)"
  need jq "jq reads kcat's JSON metadata (apt-get install jq)"
  need java "the brokers run on Java 17 (apt-get install openjdk-17-jre-headless)"
  local n i pids=() id
  if [ "$(states)" = "1=running 2=running 3=running " ] && [ "$(broker_count)" = 3 ] \
    && [ "$(cat "$run_dir/layout" 2>/dev/null)" = "$(layout)" ]; then
    echo "cluster.sh: the cluster is already running and healthy (run dir $run_dir)" >&2
    return 0
  fi
  if [ "$(states)" != "1=stopped 2=stopped 3=stopped " ]; then
    echo "cluster.sh: a cluster runs but is not healthy or set up otherwise ($(states)); starting anew" >&2
    down >/dev/null
  fi
  for n in "${nodes[@]}"; do for i in 0 1 2; do
    port_in_use "$(port "$n" $i)" && die "port $(port "$n" $i) (node $n) is in use by another process; stop it or set CLUSTER_BASE_PORT"
  done; done
  classpath
  remove_netns "$(made_netns)"
  rm -rf "$run_dir" && mkdir -p "$run_dir"
  make_netns
  make_tls
  for n in "${nodes[@]}"; do write_config "$n"; done
  layout >"$run_dir/layout"
  id=$(tool kafka.tools.StorageTool random-uuid 2>"$run_dir/format.err") && [ -n "$id" ] || { cat "$run_dir/format.err" >&2; die "StorageTool random-uuid failed"; }
  # The three formats in parallel: each is a JVM start.
  for n in "${nodes[@]}"; do
    tool kafka.tools.StorageTool format -t "$id" -c "$(node_dir "$n")/server.properties" \
      --add-scram "SCRAM-SHA-512=[name=dedupe,password=$(cat "$run_dir/tls/scram.password")]" \
      --add-scram "SCRAM-SHA-512=[name=dedupe-client,password=$(cat "$run_dir/tls/scram.password")]" \
      >"$(node_dir "$n")/format.log" 2>&1 &
    pids+=($!)
  done
  for n in "${nodes[@]}"; do wait "${pids[$((n - 1))]}" || { cat "$(node_dir "$n")/format.log" >&2; die "formatting node $n failed"; }; done
  for n in "${nodes[@]}"; do launch "$n"; done
  local deadline=$((SECONDS + start_timeout))
  until [ "$(broker_count)" = 3 ]; do
    for n in "${nodes[@]}"; do running_pid "$n" >/dev/null || { logs_hint "$n"; die "node $n exited during start (logs in $(node_dir "$n"))"; }; done
    [ $SECONDS -lt $deadline ] || die "the metadata did not list 3 brokers within ${start_timeout}s (logs in $run_dir/node*)"
    sleep 0.5
  done
  echo "cluster.sh: cluster $id started at $(list client_addr), data in $run_dir"
}

down() {
  local n pid
  # SIGTERM to all first, so they shut down together.
  for n in "${nodes[@]}"; do pid=$(running_pid "$n") && kill -TERM "$pid" 2>/dev/null || true; done
  for n in "${nodes[@]}"; do terminate "$n" 30; done
  remove_netns "$(made_netns)"
  rm -rf "$run_dir"
  echo "cluster.sh: no node runs (base port $base); $run_dir deleted"
}

signal_node() {
  local n=$1 verb=$2 pid want deadline=$((SECONDS + 10))
  pid=$(running_pid "$n") || die "node $n is not running ($(states))"
  case $verb in
    kill)
      kill -KILL "$pid"
      wait_gone "$pid" 30 || die "node $n (pid $pid) still exists 30 s after SIGKILL"
      wait_port_free "$(port "$n" 0)" 15 || die "node $n (pid $pid) is gone but its port $(port "$n" 0) still answers 15 s later"
      rm -f "$(node_dir "$n")/kafka.pid" ;;
    stop) terminate "$n" 60 ;;
    pause | resume)
      if [ $verb = pause ]; then kill -STOP "$pid"; want=paused; else kill -CONT "$pid"; want=running; fi
      until [ "$(node_state "$n")" = $want ]; do
        [ $SECONDS -lt $deadline ] || die "node $n (pid $pid) is not $want 10 s after the signal"
        sleep 0.1
      done ;;
  esac
  echo "cluster.sh: node $n (pid $pid): $verb done"
}

start_node() {
  local n=$1 pid dir deadline
  dir=$(node_dir "$n")
  if pid=$(running_pid "$n"); then die "node $n is already running (pid $pid, $(node_state "$n"))"; fi
  [ -f "$dir/data/meta.properties" ] && [ -f "$dir/server.properties" ] || die "node $n has no formatted data in $dir (run '$0 up')"
  wait_port_free "$(port "$n" 0)" 15 && wait_port_free "$(port "$n" 1)" 15 || die "node $n's ports are in use by another process"
  launch "$n"
  deadline=$((SECONDS + start_timeout))
  until lists_itself "$n"; do
    running_pid "$n" >/dev/null || { logs_hint "$n"; die "node $n exited during start (logs in $dir)"; }
    [ $SECONDS -lt $deadline ] || die "node $n did not list itself among the brokers within ${start_timeout}s (logs in $dir)"
    sleep 0.5
  done
  echo "cluster.sh: node $n started (pid $(running_pid "$n"))"
}

route() {
  local n=$1 verb=$2 name
  name=$(made_netns)
  [ -n "$name" ] || die "the cluster was made without CLUSTER_NETNS: there is nothing to $verb"
  if [ "$verb" = cut ]; then
    ip -n "$name" route replace blackhole "$subnet.1$n/32" || die "adding the blackhole route to node $n failed"
    echo "cluster.sh: node $n ($subnet.1$n) cut off from namespace $name"
  else
    ip -n "$name" route del blackhole "$subnet.1$n/32" 2>/dev/null || true
    echo "cluster.sh: node $n ($subnet.1$n) reachable from namespace $name again"
  fi
}

usage() { echo "usage: $0 up|down|kill N|stop N|start N|pause N|resume N|cut N|heal N" >&2; exit 2; }

case "${1:-}" in
  up) up ;;
  down) down ;;
  kill | stop | pause | resume) [ $# -eq 2 ] || usage; check_node "$2"; signal_node "$2" "$1" ;;
  start) [ $# -eq 2 ] || usage; check_node "$2"; start_node "$2" ;;
  cut | heal) [ $# -eq 2 ] || usage; check_node "$2"; route "$2" "$1" ;;
  *) usage ;;
esac
