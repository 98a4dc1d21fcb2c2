# Sourced by demo.sh and demo-browser.sh: what both demos set up before their load starts.
#
#   demo_setup NAME [INSTALL-FLAG]
#                     installs what is missing, starts the local broker, builds the binary and
#                     creates this run's topics. Sets: brokers, dedupe, input, output, partitions
#                     (DEMO_PARTITIONS=4), run_id, work (.dedupe-local/NAME-<run id>), and
#                     worker_metrics (the worker's metrics address in config/local.toml).
#   demo_start_worker starts `dedupe run` on the demo's topics in the background; sets worker_pid.
#   demo_verify       prints `dedupe verify` for the demo's topics; its exit status is verify's.

# Prints a phase's heading: its number, what it does and how long it takes.
demo_phase() {
  echo "demo: [$1] $2 ($(date +%H:%M:%S))"
}

demo_setup() {
  export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-/var/tmp/dedupe-target}
  partitions=${DEMO_PARTITIONS:-4}
  run_id=$(date +%s)
  input=demo.in.$run_id
  output=demo.out.$run_id
  work=.dedupe-local/$1-$run_id
  demo_phase 1/6 "installing the build's and the broker's Debian packages, if missing (a minute or two on a fresh machine)"
  deploy/local/install-deps.sh ${2:-}
  demo_phase 2/6 "starting a local Apache Kafka broker (the first time, Maven gathers its jars: about a minute)"
  brokers=$(deploy/local/kafka.sh up | tail -n 1)
  demo_phase 3/6 "building dedupe (a clean release build compiles RocksDB's C++: about 20 minutes on 2 cores; cargo's progress follows)"
  cargo build --release --locked -p dedupe-cli --bin dedupe
  dedupe=$CARGO_TARGET_DIR/release/dedupe
  deploy/local/kafka.sh create-topic "$input" "$partitions" 2>/dev/null
  deploy/local/kafka.sh create-topic "$output" "$partitions" 2>/dev/null
  mkdir -p "$work"
  worker_metrics=$(sed -n 's/^addr = "\(.*\)"/\1/p' config/local.toml | tail -n 1)
}

demo_start_worker() {
  "$dedupe" run --config config/local.toml --brokers "$brokers" --input-topic "$input" --output-topic "$output" \
    --data-dir "$work/ledger" >"$work/worker.log" 2>&1 &
  worker_pid=$!
}

demo_verify() {
  "$dedupe" verify --config config/local.toml --brokers "$brokers" --input-topic "$input" --output-topic "$output"
}
