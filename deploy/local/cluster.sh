#!/usr/bin/env bash
# Runs a local THREE-node Apache Kafka KRaft cluster on loopback for fault tests: every node is
# broker and controller in one JVM, topics are replicated three times with min.insync.replicas=2,
# and single nodes can be crashed, stopped, restarted, hung and resumed.
#
#   deploy/local/cluster.sh up           gather the jars (via kafka.sh), wipe the run dir, format all
#                                        three nodes with one cluster id, start them, wait until the
#                                        metadata lists 3 brokers; prints the bootstrap list last
#   deploy/local/cluster.sh down         SIGTERM every node (SIGKILL after 30 s), delete the run dir
#   deploy/local/cluster.sh kill N       SIGKILL node N (a crash); returns once the process is gone
#   deploy/local/cluster.sh stop N       SIGTERM node N (controlled shutdown); waits until it exited
#                                        (SIGKILL after 60 s)
#   deploy/local/cluster.sh start N      start node N again on its existing data; waits until it
#                                        answers metadata and lists itself among the brokers
#   deploy/local/cluster.sh pause N      SIGSTOP node N's JVM (a hang, e.g. a long GC pause)
#   deploy/local/cluster.sh resume N     SIGCONT node N's JVM
#   deploy/local/cluster.sh leader TOPIC PARTITION
#                                        print the node id leading that partition (exit 1 if none)
#   deploy/local/cluster.sh coordinator TRANSACTIONAL_ID
#                                        print the node id of that id's transaction coordinator
#   deploy/local/cluster.sh bootstrap    print the bootstrap list
#   deploy/local/cluster.sh status       nodes, active KRaft controller, partition leaders;
#                                        exit 0 only if all three nodes run (not paused)
#   deploy/local/cluster.sh create-topic NAME PARTITIONS [CONFIG=VALUE ...]
#                                        create a topic (idempotent, replication factor 3) with
#                                        Kafka's own TopicCommand
#   deploy/local/cluster.sh secure       print how to reach the SASL_SSL listener, one key=value
#                                        a line: bootstrap, ca (PEM file), worker_username,
#                                        client_username, password_file
#   deploy/local/cluster.sh acl ARGS...  run Kafka's AclCommand with ARGS against the cluster
#                                        (as the super user), e.g. --list
#   deploy/local/cluster.sh netns        with CLUSTER_NETNS: print, a key=value a line, the
#                                        namespace, its address and the nodes' bootstrap list there
#   deploy/local/cluster.sh cut N        drop every packet from the namespace to node N (a
#                                        blackhole route: connections hang, as on a cut cable)
#   deploy/local/cluster.sh heal N       remove that route
#
# Node N (1..3) listens on 127.0.0.1, its port P = CLUSTER_BASE_PORT+10*(N-1):
#   P    PLAINTEXT for clients and between brokers (principal User:ANONYMOUS, a super user)
#   P+1  the KRaft controller
#   P+2  SASL_SSL: TLS with a certificate signed by a CA made at `up`, SCRAM-SHA-512 with the
#        users `dedupe` (for the worker) and `dedupe-client` (for the other commands), both with
#        the password made at `up`, in the run dir's tls/scram.password; the StandardAuthorizer
#        is on and allows them only what ACLs grant
#   P+3  with CLUSTER_NETNS: PLAINTEXT on SUBNET.1N, reachable from that network namespace
# Its data, server.properties, server.log, stdout.log and kafka.pid live in $CLUSTER_RUN_DIR/nodeN.
#
# Environment:
#   CLUSTER_BASE_PORT      client port of node 1 (default 29092: nodes at 29092, 29102, 29112)
#   CLUSTER_RUN_DIR        run dir (default ${TMPDIR:-/tmp}/dedupe-cluster-$CLUSTER_BASE_PORT)
#   CLUSTER_START_TIMEOUT  seconds `up` and `start` wait for the brokers (default 120)
#   CLUSTER_NETNS          a network namespace `up` makes (root only), joined to this host by a
#                          veth pair; node N also listens on SUBNET.1N, so a client run there
#                          with `ip netns exec` reaches each node on an address of its own and
#                          can be cut off from one of them (`cut N`, `heal N`). `down` removes it.
#                          `up` restarts a running cluster made with another namespace or none.
#   CLUSTER_NETNS_SUBNET   the /24 of that namespace's link (default 10.213.0: the nodes at
#                          .11, .12, .13 on this host's end, the namespace at .2)
#   KAFKA_HEAP_OPTS        JVM heap per node (default -Xms256m -Xmx512m)
#   KAFKA_VERSION, DEDUPE_CACHE  passed on to kafka.sh, which gathers the jars
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
base=${CLUSTER_BASE_PORT:-29092}
[[ $base =~ ^[0-9]+$ ]] && [ "$base" -ge 1024 ] && [ "$base" -le 65500 ] \
  || { echo "cluster.sh: CLUSTER_BASE_PORT must be a port number between 1024 and 65500, not '$base'" >&2; exit 1; }
run_dir=${CLUSTER_RUN_DIR:-${TMPDIR:-/tmp}/dedupe-cluster-$base}
# Absolute, so the pid check (which matches the JVM's command line) works from any directory.
[[ $run_dir = /* ]] || run_dir="$PWD/$run_dir"
start_timeout=${CLUSTER_START_TIMEOUT:-120}
nodes=(1 2 3)
# transaction.state.log.num.partitions: the coordinator verb computes partitions with it.
txn_partitions=8

die() { echo "cluster.sh: $*" >&2; exit 1; }
say() { echo "cluster.sh: $*" >&2; }

need() {
  command -v "$1" >/dev/null 2>&1 || die "'$1' is not installed: $2"
}

client_port() { echo $((base + 10 * ($1 - 1))); }
controller_port() { echo $((base + 10 * ($1 - 1) + 1)); }
secure_port() { echo $((base + 10 * ($1 - 1) + 2)); }
external_port() { echo $((base + 10 * ($1 - 1) + 3)); }
node_dir() { echo "$run_dir/node$1"; }
tls_dir() { echo "$run_dir/tls"; }

# The network namespace for clients that can be cut off from single nodes (CLUSTER_NETNS), and
# the /24 it shares with the nodes over a veth pair: the nodes at .11, .12, .13 on this host's
# end, the namespace's end at .2.
netns=${CLUSTER_NETNS:-}
[ -z "$netns" ] || [[ $netns =~ ^[A-Za-z0-9_-]{1,32}$ ]] || die "CLUSTER_NETNS must be a name of letters, digits, - and _, not '$netns'"
subnet=${CLUSTER_NETNS_SUBNET:-10.213.0}
[[ $subnet =~ ^[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$ ]] || die "CLUSTER_NETNS_SUBNET must be the first three octets of an IPv4 /24, not '$subnet'"
veth_host="dk${base}h"
veth_ns="dk${base}n"
external_host() { echo "$subnet.1$1"; }

# What `up` would configure beyond the fixed settings: a running cluster set up otherwise is
# restarted.
layout() { echo "layout 2 (sasl_ssl, acls) netns=${netns:+$netns $subnet.0/24}"; }

# The namespace the running cluster made (recorded at `up`, so `down` removes it without the
# environment that made it).
made_netns() { cat "$run_dir/netns" 2>/dev/null || true; }

secure_bootstrap() {
  local n list=""
  for n in "${nodes[@]}"; do list="${list:+$list,}127.0.0.1:$(secure_port "$n")"; done
  echo "$list"
}

bootstrap_list() {
  local n list=""
  for n in "${nodes[@]}"; do list="${list:+$list,}127.0.0.1:$(client_port "$n")"; done
  echo "$list"
}

voters() {
  local n list=""
  for n in "${nodes[@]}"; do list="${list:+$list,}$n@127.0.0.1:$(controller_port "$n")"; done
  echo "$list"
}

check_node() {
  [[ ${1:-} =~ ^[123]$ ]] || die "expected a node number 1, 2 or 3, not '${1:-}'"
}

# The pid of node N's JVM if it runs (paused or not). The pid file alone is not trusted: the
# process must still be the java started with this node's server.properties (not a reused pid,
# not a zombie).
running_pid() {
  local pid_file pid
  pid_file="$(node_dir "$1")/kafka.pid"
  [ -f "$pid_file" ] || return 1
  pid=$(cat "$pid_file")
  [[ $pid =~ ^[0-9]+$ ]] || return 1
  kill -0 "$pid" 2>/dev/null || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$(node_dir "$1")/server.properties" || return 1
  echo "$pid"
}

# The process state letter (R, S, D, T, t, Z ...) from /proc/PID/stat.
proc_state() {
  local stat
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }
  echo "${stat%% *}"
}

is_paused() {
  local state
  state=$(proc_state "$1") || return 1
  [ "$state" = T ] || [ "$state" = t ]
}

# running | paused | stopped
node_state() {
  local pid
  if pid=$(running_pid "$1"); then
    if is_paused "$pid"; then echo paused; else echo running; fi
  else
    echo stopped
  fi
}

# Client addresses of the nodes that run and are not paused (a paused node accepts connections
# but never answers, so clients would wait out their request timeouts on it).
live_bootstrap() {
  local n list=""
  for n in "${nodes[@]}"; do
    [ "$(node_state "$n")" = running ] && list="${list:+$list,}127.0.0.1:$(client_port "$n")"
  done
  echo "$list"
}

port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# Waits up to SECONDS for nothing to listen on PORT any more; returns 1 if something still does.
# A node's sockets can outlive the moment its pid stops answering `kill -0` by a little.
wait_port_free() {
  local port=$1 deadline=$((SECONDS + $2))
  while port_in_use "$port"; do
    [ $SECONDS -lt "$deadline" ] || return 1
    sleep 0.2
  done
}

# kcat metadata as JSON from BOOTSTRAP, optionally for one topic.
metadata() {
  local bootstrap=$1 topic=${2:-}
  if [ -n "$topic" ]; then
    kcat -b "$bootstrap" -L -J -m 5 -t "$topic" 2>/dev/null
  else
    kcat -b "$bootstrap" -L -J -m 5 2>/dev/null
  fi
}

# Metadata from the first live node that answers (each is asked on its own port).
any_metadata() {
  local n
  for n in "${nodes[@]}"; do
    [ "$(node_state "$n")" = running ] || continue
    metadata "127.0.0.1:$(client_port "$n")" "$@" && return 0
  done
  return 1
}

broker_count() {
  metadata "$(bootstrap_list)" | jq '.brokers | length' 2>/dev/null || echo 0
}

# Whether the metadata served by node N's own port lists node N among the (unfenced) brokers.
lists_itself() {
  metadata "127.0.0.1:$(client_port "$1")" | jq -e --argjson id "$1" 'any(.brokers[]; .id == $id)' >/dev/null 2>&1
}

classpath() {
  [ -n "${cp:-}" ] && return 0
  cp=$("$here/kafka.sh" classpath) || die "could not gather Apache Kafka's jars (deploy/local/kafka.sh classpath failed)"
  [ -n "$cp" ] || die "deploy/local/kafka.sh classpath printed an empty classpath"
}

# A short-lived JVM for Kafka's command-line tools: warnings and errors only, to stderr.
# TOOL_TIMEOUT (seconds) bounds the whole run when set.
tool() {
  classpath
  local limit=()
  [ -n "${TOOL_TIMEOUT:-}" ] && limit=(timeout "$TOOL_TIMEOUT")
  ${limit[@]+"${limit[@]}"} java -Xmx256m -XX:TieredStopAtLevel=1 "-Dlog4j2.configurationFile=$here/log4j2-tools.properties" -cp "$cp" "$@"
}

# A CA, a broker certificate for 127.0.0.1 in a PKCS12 keystore, the keystore's password and the
# SCRAM password of the user `dedupe`, in $run_dir/tls (readable by this user only).
make_tls() {
  need openssl "openssl makes the cluster's CA and broker certificate (apt-get install openssl)"
  local d
  d=$(tls_dir)
  mkdir -p "$d"
  chmod 700 "$d"
  (
    umask 077
    cd "$d"
    openssl rand -hex 16 >keystore.password
    openssl rand -hex 16 >scram.password
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 30 \
      -subj "/CN=dedupe test cluster CA" 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -keyout broker.key -out broker.csr -subj "/CN=localhost" 2>/dev/null
    printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >broker.ext
    openssl x509 -req -in broker.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out broker.pem -days 30 \
      -extfile broker.ext 2>/dev/null
    openssl pkcs12 -export -in broker.pem -inkey broker.key -certfile ca.pem -name broker \
      -out broker.p12 -passout file:keystore.password
    chmod 644 ca.pem
  ) || die "making the TLS material in $d failed"
}

write_config() {
  local n=$1 dir listeners advertised map
  dir=$(node_dir "$n")
  mkdir -p "$dir/data"
  listeners="PLAINTEXT://127.0.0.1:$(client_port "$n"),CONTROLLER://127.0.0.1:$(controller_port "$n"),SASL_SSL://127.0.0.1:$(secure_port "$n")"
  advertised="PLAINTEXT://127.0.0.1:$(client_port "$n"),SASL_SSL://127.0.0.1:$(secure_port "$n")"
  map="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL"
  if [ -n "$netns" ]; then
    listeners="$listeners,EXTERNAL://$(external_host "$n"):$(external_port "$n")"
    advertised="$advertised,EXTERNAL://$(external_host "$n"):$(external_port "$n")"
    map="$map,EXTERNAL:PLAINTEXT"
  fi
  cat >"$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=$n
controller.quorum.voters=$(voters)
listeners=$listeners
advertised.listeners=$advertised
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$map
# SASL_SSL: SCRAM-SHA-512 over TLS (server authentication only).
sasl.enabled.mechanisms=SCRAM-SHA-512
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
ssl.keystore.type=PKCS12
ssl.keystore.location=$(tls_dir)/broker.p12
ssl.keystore.password=$(cat "$(tls_dir)/keystore.password")
ssl.client.auth=none
# ACLs are enforced; the plaintext listeners' principal (User:ANONYMOUS: the brokers, the
# controllers, the fault tests' clients) is a super user, so only SASL users are limited.
authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer
super.users=User:ANONYMOUS
allow.everyone.if.no.acl.found=false
log.dirs=$dir/data
num.partitions=1
default.replication.factor=3
min.insync.replicas=2
offsets.topic.replication.factor=3
offsets.topic.num.partitions=8
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=$txn_partitions
unclean.leader.election.enable=false
auto.create.topics.enable=false
delete.topic.enable=true
controlled.shutdown.enable=true
group.initial.rebalance.delay.ms=0
# The consumer group protocol (KIP-848), as in kafka.sh: a member that dies is replaced after
# the session timeout, faster than Kafka's production defaults.
group.consumer.min.session.timeout.ms=6000
group.consumer.session.timeout.ms=6000
group.consumer.min.heartbeat.interval.ms=500
group.consumer.heartbeat.interval.ms=1000
# Faster failure detection for fault tests: the active controller fences a broker that sent
# no heartbeat for 9 s and moves its partition leaderships.
broker.session.timeout.ms=9000
broker.heartbeat.interval.ms=1000
log.retention.hours=168
# Three nodes share a 2-core machine with the worker under test: fewer threads than Kafka's
# defaults (3 network, 8 I/O, 10 background) keep a starting node from being starved.
num.network.threads=2
num.io.threads=2
background.threads=2
num.recovery.threads.per.data.dir=1
PROPS
}

launch() {
  local n=$1 dir
  dir=$(node_dir "$n")
  classpath
  # shellcheck disable=SC2086 # KAFKA_HEAP_OPTS holds several JVM options
  # C1 only (TieredStopAtLevel=1): a node restarted under load starts in seconds instead of
  # competing with two others for the CPU its C2 compiler wants; a test cluster needs no more.
  setsid nohup java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx512m} -XX:+UseG1GC -XX:TieredStopAtLevel=1 -Djava.awt.headless=true \
    "-Dlog4j2.configurationFile=$here/log4j2-broker.properties" "-Ddedupe.broker.log=$dir/server.log" -cp "$cp" \
    kafka.Kafka "$dir/server.properties" >>"$dir/stdout.log" 2>&1 </dev/null &
  local pid=$! jvm="" i
  # setsid forks when its caller leads a process group, and then $! is not the JVM: record the
  # JVM's own pid, found by its command line (unique per node).
  for i in $(seq 1 50); do
    jvm=$(pgrep -n -f -- "kafka.Kafka $dir/server.properties") && break
    sleep 0.1
  done
  echo "${jvm:-$pid}" >"$dir/kafka.pid"
}

logs_hint() {
  local dir
  dir=$(node_dir "$1")
  tail -n 30 "$dir/stdout.log" "$dir/server.log" >&2 2>/dev/null || true
}

# Waits up to SECONDS for PID to exit; returns 1 if it still runs.
wait_gone() {
  local pid=$1 deadline=$((SECONDS + $2)) state
  while kill -0 "$pid" 2>/dev/null; do
    state=$(proc_state "$pid") || break
    [ "$state" = Z ] && break
    [ $SECONDS -lt "$deadline" ] || return 1
    sleep 0.2
  done
  return 0
}

# SIGTERM node N; a paused node is resumed so it can shut down (finish_terminate waits).
terminate() {
  local n=$1 pid
  pid=$(running_pid "$n") || return 0
  kill -TERM "$pid" 2>/dev/null || true
  is_paused "$pid" && kill -CONT "$pid" 2>/dev/null || true
}

finish_terminate() {
  local n=$1 pid=$2 grace=$3
  if ! wait_gone "$pid" "$grace"; then
    say "node $n (pid $pid) did not exit within ${grace}s of SIGTERM; sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "node $n (pid $pid) survived SIGKILL"
  fi
  rm -f "$(node_dir "$n")/kafka.pid"
}

healthy() {
  local n
  for n in "${nodes[@]}"; do [ "$(node_state "$n")" = running ] || return 1; done
  [ "$(broker_count)" = 3 ]
}

up() {
  need kcat "kcat reads the cluster's metadata (apt-get install kcat)"
  need jq "jq reads kcat's JSON metadata (apt-get install jq)"
  need java "the brokers run on Java 17 (apt-get install openjdk-17-jre-headless)"
  local n pids=()
  if healthy && [ "$(cat "$run_dir/layout" 2>/dev/null)" = "$(layout)" ]; then
    say "the cluster is already running and healthy (run dir $run_dir)"
    bootstrap_list
    return 0
  fi
  for n in "${nodes[@]}"; do
    if running_pid "$n" >/dev/null; then
      say "a cluster from this script runs but is not healthy or set up otherwise (node states: $(states); $(cat "$run_dir/layout" 2>/dev/null || echo 'no layout'), wanted $(layout)); tearing it down and starting anew"
      down >/dev/null
      break
    fi
  done
  for n in "${nodes[@]}"; do
    port_in_use "$(client_port "$n")" && die "port $(client_port "$n") (node $n's client port) is already in use by another process; stop it or set CLUSTER_BASE_PORT"
    port_in_use "$(controller_port "$n")" && die "port $(controller_port "$n") (node $n's controller port) is already in use by another process; stop it or set CLUSTER_BASE_PORT"
    port_in_use "$(secure_port "$n")" && die "port $(secure_port "$n") (node $n's SASL_SSL port) is already in use by another process; stop it or set CLUSTER_BASE_PORT"
  done
  classpath
  remove_netns "$(made_netns)"
  rm -rf "$run_dir"
  mkdir -p "$run_dir"
  make_netns
  make_tls
  for n in "${nodes[@]}"; do write_config "$n"; done
  layout >"$run_dir/layout"
  local cluster_id
  cluster_id=$(tool kafka.tools.StorageTool random-uuid 2>"$run_dir/format.err") \
    || { cat "$run_dir/format.err" >&2; die "StorageTool random-uuid failed"; }
  [ -n "$cluster_id" ] || die "StorageTool random-uuid printed no cluster id"
  echo "$cluster_id" >"$run_dir/cluster.id"
  # Format the three nodes in parallel: each format is a JVM start.
  for n in "${nodes[@]}"; do
    tool kafka.tools.StorageTool format -t "$cluster_id" -c "$(node_dir "$n")/server.properties" \
      --add-scram "SCRAM-SHA-512=[name=dedupe,password=$(cat "$(tls_dir)/scram.password")]" \
      --add-scram "SCRAM-SHA-512=[name=dedupe-client,password=$(cat "$(tls_dir)/scram.password")]" \
      >"$(node_dir "$n")/format.log" 2>&1 &
    pids+=($!)
  done
  for n in "${nodes[@]}"; do
    wait "${pids[$((n - 1))]}" || { cat "$(node_dir "$n")/format.log" >&2; die "formatting KRaft storage of node $n in $(node_dir "$n")/data failed"; }
  done
  for n in "${nodes[@]}"; do launch "$n"; done
  local deadline=$((SECONDS + start_timeout))
  until [ "$(broker_count)" = 3 ]; do
    for n in "${nodes[@]}"; do
      if ! running_pid "$n" >/dev/null; then
        logs_hint "$n"
        die "node $n exited during start (logs in $(node_dir "$n"))"
      fi
    done
    [ $SECONDS -lt $deadline ] || die "the metadata did not list 3 brokers within ${start_timeout}s (logs in $run_dir/node*)"
    sleep 0.5
  done
  echo "cluster.sh: Apache Kafka cluster $cluster_id started: 3 nodes (pids $(for n in "${nodes[@]}"; do printf '%s ' "$(running_pid "$n")"; done| sed 's/ $//')), data in $run_dir"
  bootstrap_list
}

down() {
  local n pid pids=() any=0
  for n in "${nodes[@]}"; do
    if pid=$(running_pid "$n"); then
      terminate "$n"
      pids[$n]=$pid
      any=1
    fi
  done
  for n in "${nodes[@]}"; do
    [ -n "${pids[$n]:-}" ] && finish_terminate "$n" "${pids[$n]}" 30
  done
  remove_netns "$(made_netns)"
  rm -rf "$run_dir"
  if [ $any = 1 ]; then
    echo "cluster.sh: cluster stopped, $run_dir deleted"
  else
    echo "cluster.sh: no node started by this script runs (base port $base); $run_dir deleted"
  fi
}

kill_node() {
  local n=$1 pid
  check_node "$n"
  pid=$(running_pid "$n") || die "node $n is not running (no live process for $(node_dir "$n")/kafka.pid)"
  kill -KILL "$pid"
  wait_gone "$pid" 30 || die "node $n (pid $pid) still exists 30 s after SIGKILL"
  wait_port_free "$(client_port "$n")" 15 || die "node $n (pid $pid) is gone but its client port $(client_port "$n") still answers 15 s later"
  rm -f "$(node_dir "$n")/kafka.pid"
  echo "cluster.sh: node $n (pid $pid) killed"
}

stop_node() {
  local n=$1 pid
  check_node "$n"
  pid=$(running_pid "$n") || die "node $n is not running (no live process for $(node_dir "$n")/kafka.pid)"
  is_paused "$pid" && say "node $n is paused; resuming it so it can shut down"
  terminate "$n"
  finish_terminate "$n" "$pid" 60
  echo "cluster.sh: node $n (pid $pid) stopped"
}

start_node() {
  local n=$1 pid dir
  check_node "$n"
  need kcat "kcat reads the cluster's metadata (apt-get install kcat)"
  need jq "jq reads kcat's JSON metadata (apt-get install jq)"
  dir=$(node_dir "$n")
  if pid=$(running_pid "$n"); then die "node $n is already running (pid $pid, $(node_state "$n"))"; fi
  [ -f "$dir/data/meta.properties" ] \
    || die "node $n has no formatted data in $dir/data (run '$0 up' to create the cluster)"
  [ -f "$dir/server.properties" ] || die "node $n has no $dir/server.properties (run '$0 up' to create the cluster)"
  wait_port_free "$(client_port "$n")" 15 || die "port $(client_port "$n") (node $n's client port) is already in use by another process"
  wait_port_free "$(controller_port "$n")" 15 || die "port $(controller_port "$n") (node $n's controller port) is already in use by another process"
  launch "$n"
  local deadline=$((SECONDS + start_timeout))
  until lists_itself "$n"; do
    if ! running_pid "$n" >/dev/null; then
      logs_hint "$n"
      die "node $n exited during start (logs in $dir)"
    fi
    [ $SECONDS -lt $deadline ] || die "node $n did not list itself among the brokers on 127.0.0.1:$(client_port "$n") within ${start_timeout}s (logs in $dir)"
    sleep 0.5
  done
  echo "cluster.sh: node $n started (pid $(running_pid "$n")) at 127.0.0.1:$(client_port "$n")"
}

pause_node() {
  local n=$1 pid
  check_node "$n"
  pid=$(running_pid "$n") || die "node $n is not running"
  if is_paused "$pid"; then echo "cluster.sh: node $n (pid $pid) is already paused"; return 0; fi
  kill -STOP "$pid"
  local deadline=$((SECONDS + 10))
  until is_paused "$pid"; do
    [ $SECONDS -lt $deadline ] || die "node $n (pid $pid) is not in the stopped state 10 s after SIGSTOP"
    sleep 0.1
  done
  echo "cluster.sh: node $n (pid $pid) paused"
}

resume_node() {
  local n=$1 pid
  check_node "$n"
  pid=$(running_pid "$n") || die "node $n is not running"
  if ! is_paused "$pid"; then echo "cluster.sh: node $n (pid $pid) is not paused"; return 0; fi
  kill -CONT "$pid"
  local deadline=$((SECONDS + 10))
  while is_paused "$pid"; do
    [ $SECONDS -lt $deadline ] || die "node $n (pid $pid) is still stopped 10 s after SIGCONT"
    sleep 0.1
  done
  echo "cluster.sh: node $n (pid $pid) resumed"
}

# The leader id of TOPIC's PARTITION from JSON metadata on stdin; nothing if it has none.
leader_from() {
  jq -r --arg t "$1" --argjson p "$2" \
    'first(.topics[] | select(.topic == $t) | .partitions[] | select(.partition == $p) | .leader | select(. >= 0)) // empty'
}

leader() {
  local topic=${1:?usage: leader TOPIC PARTITION} partition=${2:?usage: leader TOPIC PARTITION} md id
  [[ $partition =~ ^[0-9]+$ ]] || die "partition must be a number, not '$partition'"
  need kcat "kcat reads the cluster's metadata (apt-get install kcat)"
  md=$(any_metadata "$topic") || die "no node answers metadata requests (node states: $(states))"
  id=$(leader_from "$topic" "$partition" <<<"$md")
  [ -n "$id" ] || exit 1
  echo "$id"
}

# Java's String.hashCode (UTF-16 code units, 32-bit signed overflow), then Kafka's
# TransactionStateManager.partitionFor: Utils.abs(hashCode) % partitions, where Utils.abs maps
# Integer.MIN_VALUE to 0 and is Math.abs otherwise. (Not `& 0x7fffffff`, which Kafka uses for
# record keys: the two differ for every negative hash.)
txn_partition() {
  python3 - "$1" "$txn_partitions" <<'PY'
import sys
s, parts = sys.argv[1], int(sys.argv[2])
units = s.encode("utf-16-be")
h = 0
for i in range(0, len(units), 2):
    h = (31 * h + int.from_bytes(units[i:i + 2], "big")) & 0xFFFFFFFF
if h >= 0x80000000:
    h -= 0x100000000
a = 0 if h == -0x80000000 else abs(h)
print(a % parts)
PY
}

coordinator() {
  local txn_id=${1:?usage: coordinator TRANSACTIONAL_ID} partition md id
  need kcat "kcat reads the cluster's metadata (apt-get install kcat)"
  need python3 "python3 computes Java's String.hashCode of the transactional id"
  partition=$(txn_partition "$txn_id")
  md=$(any_metadata __transaction_state) || die "no node answers metadata requests (node states: $(states))"
  jq -e 'any(.topics[]; .topic == "__transaction_state" and (.partitions | length) > 0)' >/dev/null <<<"$md" \
    || die "the __transaction_state topic does not exist yet (it is created on the first FindCoordinator request of a transactional producer)"
  id=$(leader_from __transaction_state "$partition" <<<"$md")
  [ -n "$id" ] || die "__transaction_state partition $partition (of transactional id '$txn_id') has no leader"
  echo "$id"
}

states() {
  local n
  for n in "${nodes[@]}"; do printf '%s=%s ' "$n" "$(node_state "$n")"; done | sed 's/ $//'
}

status() {
  local n pid state all=0 live md
  for n in "${nodes[@]}"; do
    state=$(node_state "$n")
    if pid=$(running_pid "$n"); then :; else pid=-; fi
    printf 'node %s: %-8s pid %-8s client 127.0.0.1:%s controller 127.0.0.1:%s\n' \
      "$n" "$state" "$pid" "$(client_port "$n")" "$(controller_port "$n")"
    [ "$state" = running ] || all=1
  done
  live=$(live_bootstrap)
  if [ -z "$live" ]; then
    echo "no node answers: no controller, no leaders"
    return 1
  fi
  # The active KRaft controller, from the quorum itself (the metadata's controller id is just an
  # arbitrary live broker under KRaft).
  local quorum leader_id epoch
  printf 'request.timeout.ms=5000\ndefault.api.timeout.ms=15000\n' >"$run_dir/tools.properties"
  if quorum=$(TOOL_TIMEOUT=40 tool org.apache.kafka.tools.MetadataQuorumCommand --bootstrap-server "$live" \
      --command-config "$run_dir/tools.properties" describe --status 2>&1); then
    leader_id=$(sed -n 's/^LeaderId:[[:space:]]*//p' <<<"$quorum")
    epoch=$(sed -n 's/^LeaderEpoch:[[:space:]]*//p' <<<"$quorum")
    echo "active controller: node ${leader_id:-?} (leader epoch ${epoch:-?})"
  else
    echo "active controller: unknown (MetadataQuorumCommand failed: $(tail -n 1 <<<"$quorum"))"
  fi
  if md=$(any_metadata); then
    jq -r '
      def leaders: [.partitions | sort_by(.partition)[] | "\(.partition)=\(if .leader < 0 then "none" else .leader end)"] | join(" ");
      (.topics | map(select(.topic | startswith("__") | not)) | sort_by(.topic)[] | "topic \(.topic): leaders \(leaders)"),
      (.topics[] | select(.topic == "__transaction_state") | "__transaction_state: leaders \(leaders)"),
      "brokers in metadata: \([.brokers[].id] | sort | map(tostring) | join(","))"
    ' <<<"$md"
    jq -e 'any(.topics[]; .topic == "__transaction_state")' >/dev/null <<<"$md" \
      || echo "__transaction_state: not created yet"
  else
    echo "metadata: no live node answered within 5 s"
  fi
  return $all
}

create_topic() {
  local name=${1:?usage: create-topic NAME PARTITIONS [CONFIG=VALUE ...]} partitions=${2:?usage: create-topic NAME PARTITIONS [CONFIG=VALUE ...]}
  shift 2
  local configs=() kv live
  for kv in "$@"; do configs+=(--config "$kv"); done
  live=$(live_bootstrap)
  [ -n "$live" ] || die "no node of the cluster runs (node states: $(states)); run '$0 up'"
  tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$live" --create --if-not-exists \
    --topic "$name" --partitions "$partitions" --replication-factor 3 ${configs[@]+"${configs[@]}"}
}

make_netns() {
  [ -n "$netns" ] || return 0
  need ip "ip (iproute2) makes the network namespace (apt-get install iproute2)"
  [ "$(id -u)" = 0 ] || die "CLUSTER_NETNS needs root: 'ip netns add' and veth pairs are privileged"
  remove_netns "$netns"
  ip netns add "$netns" || die "ip netns add $netns failed"
  ip link add "$veth_host" type veth peer name "$veth_ns" || die "creating the veth pair $veth_host/$veth_ns failed"
  ip link set "$veth_ns" netns "$netns"
  local n
  for n in "${nodes[@]}"; do ip addr add "$(external_host "$n")/24" dev "$veth_host"; done
  ip link set "$veth_host" up
  ip -n "$netns" addr add "$subnet.2/24" dev "$veth_ns"
  ip -n "$netns" link set "$veth_ns" up
  ip -n "$netns" link set lo up
  echo "$netns" >"$run_dir/netns"
}

remove_netns() {
  local name=$1
  [ -n "$name" ] || return 0
  ip netns list 2>/dev/null | grep -qE "^$name( |$)" && ip netns del "$name"
  # Deleting the namespace deletes its end of the pair, and with it this host's end.
  ip link del "$veth_host" 2>/dev/null || true
}

netns_info() {
  local name n list=""
  name=$(made_netns)
  [ -n "$name" ] || die "the cluster was made without CLUSTER_NETNS (run dir $run_dir)"
  for n in "${nodes[@]}"; do list="${list:+$list,}$(external_host "$n"):$(external_port "$n")"; done
  echo "netns=$name"
  echo "address=$subnet.2"
  echo "bootstrap=$list"
}

cut_node() {
  local n=$1 name
  check_node "$n"
  name=$(made_netns)
  [ -n "$name" ] || die "the cluster was made without CLUSTER_NETNS: there is nothing to cut"
  ip -n "$name" route replace blackhole "$(external_host "$n")/32" || die "adding the blackhole route to node $n failed"
  echo "cluster.sh: node $n ($(external_host "$n")) cut off from network namespace $name"
}

heal_node() {
  local n=$1 name
  check_node "$n"
  name=$(made_netns)
  [ -n "$name" ] || die "the cluster was made without CLUSTER_NETNS: there is nothing to heal"
  ip -n "$name" route del blackhole "$(external_host "$n")/32" 2>/dev/null || true
  echo "cluster.sh: node $n ($(external_host "$n")) reachable from network namespace $name again"
}

secure() {
  [ -f "$(tls_dir)/ca.pem" ] || die "no cluster made by this script in $run_dir (run '$0 up')"
  echo "bootstrap=$(secure_bootstrap)"
  echo "ca=$(tls_dir)/ca.pem"
  echo "worker_username=dedupe"
  echo "client_username=dedupe-client"
  echo "password_file=$(tls_dir)/scram.password"
}

acl() {
  local live
  live=$(live_bootstrap)
  [ -n "$live" ] || die "no node of the cluster runs (node states: $(states)); run '$0 up'"
  tool org.apache.kafka.tools.AclCommand --bootstrap-server "$live" "$@"
}

usage() {
  echo "usage: $0 up|down|status|bootstrap|kill N|stop N|start N|pause N|resume N|leader TOPIC PARTITION|coordinator TRANSACTIONAL_ID|create-topic NAME PARTITIONS [CONFIG=VALUE ...]|secure|acl ARGS...|netns|cut N|heal N" >&2
  exit 2
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  kill) [ $# -eq 2 ] || usage; kill_node "$2" ;;
  stop) [ $# -eq 2 ] || usage; stop_node "$2" ;;
  start) [ $# -eq 2 ] || usage; start_node "$2" ;;
  pause) [ $# -eq 2 ] || usage; pause_node "$2" ;;
  resume) [ $# -eq 2 ] || usage; resume_node "$2" ;;
  leader) [ $# -eq 3 ] || usage; leader "$2" "$3" ;;
  coordinator) [ $# -eq 2 ] || usage; coordinator "$2" ;;
  bootstrap) bootstrap_list ;;
  status) status ;;
  create-topic) [ $# -ge 3 ] || usage; shift; create_topic "$@" ;;
  secure) secure ;;
  acl) shift; acl "$@" ;;
  netns) netns_info ;;
  cut) [ $# -eq 2 ] || usage; cut_node "$2" ;;
  heal) [ $# -eq 2 ] || usage; heal_node "$2" ;;
  *) usage ;;
esac
