#!/usr/bin/env python3
"""A rolling upgrade and a rollback under load, against the local broker (run by upgrade.sh).

Three group-mode workers and a front door of the old release run under a load: records straight
into the input (`dedupe loadgen`: 5% retries, 0.1% reused ids) and Segment batches through the
front door (5% of batches sent again whole, 0.1% of events reusing an earlier messageId for other
content; a batch whose answer is lost is sent again, as a client does). One at a time, the front
door and each worker are replaced by the new build while the load runs, then rolled back one at a
time. After each step the load stops, the workers catch up, and `dedupe verify` reads both topics
to their ends, read committed: the step's line says how many ids were sent, how many output
records there are, how many ids are in the output twice and how many are missing, and the
workers' smallest window. Each id once and none missing at every step, or the run fails.

With --limit-on-new the new build's workers run under a retention limit, so their ledgers become
format 4, which the old release refuses: each rollback step then checks the old worker's refusal
says what docs/upgrading.md says it says, moves the ledger aside and starts the old worker on an
empty directory, as the rollback section tells an operator to.

Prints one JSON object per step and a summary object last; exits 1 when any step lost or repeated
an id.
"""

import argparse
import base64
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import uuid

WORKERS = 3
PARTITIONS = 6
SOURCE = "upgrade"
WRITE_KEY = "upgrade-write-key"
# The step in which an id is forgotten (from 0.9, which has `dedupe forget`).
FORGET_STEP = "worker 0 to new"
# The steps in which --kill SIGKILLs the worker before (worker 0, running the new build), which
# then starts again as it was.
KILL_STEPS = ("worker 1 to new", "worker 1 back to old")
# The new build's retention limit with --limit-on-new.
LIMIT_SECS = 60
# What the old release says when it refuses a newer ledger, as docs/upgrading.md quotes it.
REFUSAL = "the ledger has format version 4; this build reads versions 1 to 3"


def log(message):
    print(f"upgrade: {message}", file=sys.stderr, flush=True)


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_ok(url, timeout=1.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


class Process:
    """One worker or the front door: which binary runs it, where it logs."""

    def __init__(self, name, run, env, args, ready_url):
        self.name, self.run, self.env, self.args, self.ready_url = name, run, env, args, ready_url
        self.proc = None
        self.binary = None
        self.version = None

    def start(self, binary, version, extra_env=None, wait_ready=True):
        env = dict(os.environ, **self.env, **(extra_env or {}))
        logf = open(os.path.join(self.run, f"{self.name}.log"), "ab")
        logf.write(f"--- {version} ({binary}) at {time.strftime('%H:%M:%S')}\n".encode())
        logf.flush()
        self.proc = subprocess.Popen([binary] + self.args, env=env, stdout=logf, stderr=logf)
        self.binary, self.version = binary, version
        if not wait_ready:
            return
        deadline = time.time() + 60
        while not http_ok(self.ready_url):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} ({version}) exited with {self.proc.returncode} at start; see {self.run}/{self.name}.log")
            if time.time() > deadline:
                raise RuntimeError(f"{self.name} ({version}) not ready after 60 s; see {self.run}/{self.name}.log")
            time.sleep(0.2)

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class FrontDoorLoad(threading.Thread):
    """Segment batches through the front door, as retrying clients send them."""

    def __init__(self, url, events, rng):
        super().__init__(daemon=True)
        self.url, self.events, self.rng = url, events, rng
        self.sent_ids = set()
        self.retries = 0
        self.error = None

    def post(self, body):
        auth = base64.b64encode(f"{WRITE_KEY}:".encode()).decode()
        request = urllib.request.Request(
            self.url,
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json", "Authorization": f"Basic {auth}"},
        )
        # A lost answer (the front door replaced meanwhile) is sent again: at least once.
        deadline = time.time() + 60
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                if e.code < 500 and e.code != 429:
                    raise RuntimeError(f"the front door refused a batch: {e.code} {e.read()[:200]!r}")
            except (urllib.error.URLError, OSError):
                pass
            if time.time() > deadline:
                raise RuntimeError("the front door did not take a batch for 60 s")
            self.retries += 1
            time.sleep(0.2)

    def run(self):
        try:
            sent = 0
            earlier = []
            while sent < self.events:
                batch = []
                for _ in range(min(20, self.events - sent)):
                    if earlier and self.rng.random() < 0.001:
                        message_id = self.rng.choice(earlier)  # reused for other content
                    else:
                        message_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
                    earlier.append(message_id)
                    self.sent_ids.add(message_id)
                    batch.append({"type": "track", "event": "Upgrade", "userId": "u",
                                  "messageId": message_id,
                                  "properties": {"n": self.rng.getrandbits(32)}})
                    sent += 1
                body = {"batch": batch}
                self.post(body)
                if self.rng.random() < 0.05:
                    self.post(body)  # a retry of a batch whose answer was lost
        except Exception as e:  # reported by the step
            self.error = e


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--from-version", required=True)
    parser.add_argument("--to-version", required=True)
    parser.add_argument("--old", required=True, help="the old release's binary")
    parser.add_argument("--new", required=True, help="the new build's binary")
    parser.add_argument("--brokers", required=True)
    parser.add_argument("--kafka-sh", required=True)
    parser.add_argument("--records", type=int, default=6000, help="records into the input per step")
    parser.add_argument("--events", type=int, default=2000, help="events through the front door per step")
    parser.add_argument("--rate", type=float, default=2000.0)
    parser.add_argument("--limit-on-new", action="store_true")
    parser.add_argument("--kill", action="store_true",
                        help="SIGKILL another worker while one is replaced, each way")
    args = parser.parse_args()

    tag = f"{args.from_version.replace('.', '-')}-{int(time.time())}"
    run = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"dedupe-upgrade-{tag}")
    os.makedirs(run)
    topic_in, topic_out = f"upgrade.{tag}.in", f"upgrade.{tag}.out"
    topics = [[topic_in], [topic_out]]
    promised = 3600
    if args.limit_on_new:
        # A limit of a minute: generations span 7.5 s, so a new worker's ledger starts a
        # millisecond generation (format 4) within the step. The id changelog may keep an id no
        # longer than the limit plus a generation's span, which the new build checks at start, and
        # no shorter than the promise, which the old one checks: made so before either starts.
        promised = LIMIT_SECS
        topics.append([f"{topic_out}.ids", f"retention.ms={LIMIT_SECS * 1000}",
                       f"segment.ms={LIMIT_SECS // 8 * 1000}"])
    for topic in topics:
        subprocess.run([args.kafka_sh, "create-topic", topic[0], str(PARTITIONS)] + topic[1:],
                       check=True, stdout=subprocess.DEVNULL)
    config = os.path.join(run, "dedupe.toml")
    front_port = free_port()
    with open(config, "w") as f:
        f.write(f"""[kafka]
brokers = "{args.brokers}"
[worker]
input_topic = "{topic_in}"
output_topic = "{topic_out}"
assignment = "group"
promised_window_secs = {promised}
[ledger]
budget_bytes = "256MiB"
write_buffer_bytes = "4MiB"
[ingest]
listen = "127.0.0.1:{front_port}"
topic = "{topic_in}"
""")
    workers = []
    for i in range(WORKERS):
        port = free_port()
        workers.append(Process(
            f"worker-{i}", run,
            {"DEDUPE_METRICS_ADDR": f"127.0.0.1:{port}"},
            # Each its own static member: a release before 0.14 takes the host name as its member
            # id by default, the same for the three workers of one host.
            ["run", "--config", config, "--data-dir", os.path.join(run, f"ledger-{i}"),
             "--member-id", f"worker-{i}"],
            f"http://127.0.0.1:{port}/healthz"))
    front_metrics = free_port()
    front = Process(
        "front-door", run,
        {"DEDUPE_METRICS_ADDR": f"127.0.0.1:{front_metrics}",
         "DEDUPE_WRITE_KEYS": f"{WRITE_KEY}={SOURCE}"},
        ["ingest", "--config", config],
        f"http://127.0.0.1:{front_port}/healthz")
    new_env = {"DEDUPE_LEDGER_MAX_WINDOW_SECS": str(LIMIT_SECS)} if args.limit_on_new else {}

    def swap(process, to_new):
        """Replaces `process` by the other build; True when the old release refused its ledger."""
        worker = process.name.startswith("worker")
        process.stop()
        if to_new:
            process.start(args.new, args.to_version, new_env if worker else None)
            return False
        if worker and args.limit_on_new and refuses(process):
            data_dir = process.args[process.args.index("--data-dir") + 1]
            shutil.move(data_dir, data_dir + ".format4")
            log(f"{process.name}: refused as documented; ledger moved aside, starting on an empty one")
            process.start(args.old, args.from_version)
            return True
        if process.proc is None:
            process.start(args.old, args.from_version)
        return False

    def refuses(process):
        """Starts the old release on the worker's ledger: True when it refuses it, in the words
        upgrading.md quotes; False when it opens it (its ledger is still format 3: no generation
        was started under the limit), and it is left running."""
        process.start(args.old, args.from_version, wait_ready=False)
        deadline = time.time() + 60
        while process.proc.poll() is None and not http_ok(process.ready_url):
            if time.time() > deadline:
                raise RuntimeError(f"{process.name}: the old release neither refused its ledger nor started in 60 s")
            time.sleep(0.2)
        if process.proc.poll() is None:
            return False
        with open(os.path.join(run, f"{process.name}.log"), errors="replace") as f:
            said = f.read().split("--- ")[-1]
        if process.proc.returncode == 0 or REFUSAL not in said:
            raise RuntimeError(f"{process.name}: the old release did not refuse the format 4 ledger as upgrading.md says (exit {process.proc.returncode}): {said[-500:]}")
        process.proc = None
        return True

    steps = [("start", None, None)]
    steps.append(("front door to new", front, True))
    steps += [(f"worker {i} to new", workers[i], True) for i in range(WORKERS)]
    steps += [(f"worker {i} back to old", workers[i], False) for i in reversed(range(WORKERS))]
    steps.append(("front door back to old", front, False))

    rng = random.Random(int(time.time()))
    results, failed = [], False
    # From 0.9 on (dedupe forget): one id of the first step forgotten in flight, and explained at
    # the end, after the rollback, by the old release.
    forgets_allowed = int(args.from_version.split(".")[1]) >= 9
    forget_id, forgets = None, []
    sent_ids = 0
    try:
        log(f"starting {args.from_version}: a front door and {WORKERS} workers in group mode ({run})")
        front.start(args.old, args.from_version)
        for w in workers:
            w.start(args.old, args.from_version)
        for name, process, to_new in steps:
            loadgen = subprocess.Popen(
                [args.new, "loadgen", "--config", config, "--topic", topic_in,
                 "--count", str(args.records), "--dup-ratio", "0.05", "--reused-ratio", "0.001",
                 "--rate", str(args.rate)],
                stdout=subprocess.DEVNULL, stderr=open(os.path.join(run, "loadgen.log"), "ab"))
            door = FrontDoorLoad(f"http://127.0.0.1:{front_port}/v1/batch", args.events, rng)
            door.start()
            time.sleep(1.0)
            refused = False
            forgotten_by = None
            if name == FORGET_STEP and forget_id is not None:
                # A forget in flight while worker 0 is replaced: answered by whichever worker owns
                # the id's partition then. Its copy is never sent again, so the output keeps it once.
                forgotten_by = threading.Thread(
                    target=lambda: forgets.append(forget_on_its_partition(args, config, workers, forget_id)))
                forgotten_by.start()
            if process is not None:
                log(f"{name}, under load")
                victim = workers[(workers.index(process) - 1) % WORKERS] if process in workers else None
                if args.kill and victim is not None and name in KILL_STEPS:
                    log(f"{victim.name} ({victim.version}) SIGKILLed meanwhile")
                    victim.proc.kill()
                    victim.proc.wait()
                refused = swap(process, to_new)
                if args.kill and victim is not None and name in KILL_STEPS:
                    victim.start(victim.binary, victim.version,
                                 new_env if victim.version == args.to_version else None)
            if loadgen.wait(timeout=300) != 0:
                raise RuntimeError("dedupe loadgen failed; see loadgen.log")
            door.join(timeout=300)
            if door.error:
                raise RuntimeError(f"the front door's load: {door.error}")
            if forgotten_by is not None:
                forgotten_by.join(timeout=120)
                if not forgets:
                    raise RuntimeError(f"the forget of {forget_id} was not answered")
            if forget_id is None and forgets_allowed:
                forget_id = sorted(door.sent_ids)[0]
            sent_ids += args.records + args.events
            line = settle(args, config, workers, name, sent_ids, door.retries)
            line["fleet"] = {"front_door": front.version, **{w.name: w.version for w in workers}}
            line["old_release_refused_the_ledger"] = refused
            if forgets and name == FORGET_STEP:
                line["forgot"] = {"id": f"{SOURCE}:{forget_id}", "answered_by": forgets[0][0]}
            results.append(line)
            print(json.dumps(line), flush=True)
            failed |= line["duplicates"] > 0 or line["missing"] > 0
        if forgets:
            owner, said = ask_workers(
                args.old, config, workers, ["explain", "--source", SOURCE, forget_id],
                owned=lambda out: json.loads(out.splitlines()[0]).get("owned") is True)
            answer = json.loads(said.splitlines()[0])
            if answer.get("held") or answer.get("reason") != "forgotten":
                log(f"the id forgotten in flight is not forgotten after the rollback: {answer}")
                failed = True
            else:
                log(f"the id forgotten in flight answers forgotten after the rollback ({owner})")
    finally:
        for p in workers + [front]:
            p.stop()
    summary = {
        "from": args.from_version, "to": args.to_version, "steps": len(results),
        "sent": results[-1]["distinct_ids"] if results else 0,
        "input_records": results[-1]["input_records"] if results else 0,
        "output_records": results[-1]["output_records"] if results else 0,
        "duplicates": sum(r["duplicates"] for r in results),
        "missing": sum(r["missing"] for r in results),
        "limit_on_new": args.limit_on_new,
        "kill": args.kill,
        "forgotten_in_flight": bool(forgets),
        "rollbacks_refused": sum(r["old_release_refused_the_ledger"] for r in results),
        "run_dir": run,
    }
    print(json.dumps(summary), flush=True)
    if args.limit_on_new and summary["rollbacks_refused"] == 0:
        log("with a limit on the new build, no rollback met a format 4 ledger: nothing was shown")
        failed = True
    if not failed and len(results) == len(steps):
        shutil.rmtree(run, ignore_errors=True)
    return 1 if failed or len(results) != len(steps) else 0


def ask_workers(binary, config, workers, command, owned=lambda stdout: True, deadline_secs=60):
    """Runs `dedupe <command>` against each worker's admin endpoint in turn until the worker that
    owns the id's partition answers it (exit 0, and `owned` of its output). Returns (worker name,
    stdout)."""
    deadline = time.time() + deadline_secs
    said = ""
    while time.time() < deadline:
        for w in workers:
            env = dict(os.environ, DEDUPE_METRICS_ADDR=w.env["DEDUPE_METRICS_ADDR"])
            out = subprocess.run([binary] + command[:1] + ["--config", config] + command[1:],
                                 env=env, capture_output=True, text=True)
            if out.returncode == 0 and owned(out.stdout):
                return w.name, out.stdout
            said = (out.stdout.strip() + " " + out.stderr.strip())[-600:]
        time.sleep(1)
    raise RuntimeError(f"no worker answered `dedupe {' '.join(command)}` in {deadline_secs} s: {said}")


def forget_on_its_partition(args, config, workers, message_id):
    """Forgets the front door's id on the partition the front door's partitioner gives it (as
    `dedupe explain` names it), asking each worker until its owner answers. Without --partition a
    forget goes to the partitions of both common partitioners, which two workers may own."""
    _, said = ask_workers(args.new, config, workers, ["explain", "--source", SOURCE, message_id])
    partition = json.loads(said.splitlines()[0])["partition"]
    return ask_workers(args.new, config, workers,
                       ["forget", "--source", SOURCE, "--partition", str(partition), message_id])


def settle(args, config, workers, name, sent_ids, door_retries):
    """Waits until the output holds every input id (or 120 s), then verifies."""
    deadline = time.time() + 120
    while True:
        out = subprocess.run([args.new, "verify", "--config", config, "--timeout-secs", "60"],
                             capture_output=True, text=True)
        try:
            summary = json.loads(out.stdout)
        except json.JSONDecodeError:
            raise RuntimeError(f"dedupe verify: {out.stderr.strip()[-500:]}")
        if summary["input_ids_missing_from_output"] == 0 or time.time() > deadline:
            break
        time.sleep(2)
    return {
        "step": name,
        "input_records": summary["input_records"],
        "distinct_ids": summary["distinct_input_ids"],
        "output_records": summary["output_records"],
        "duplicates": summary["duplicate_ids_in_output"],
        "missing": summary["input_ids_missing_from_output"],
        "not_in_input": summary["output_ids_not_in_input"],
        "front_door_resends": door_retries,
        "window_secs": smallest_window(workers),
    }


def smallest_window(workers):
    """The smallest dedupe_window_seconds any worker exports, or None."""
    smallest = None
    for w in workers:
        url = w.ready_url.replace("/healthz", "/metrics")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                for line in r.read().decode().splitlines():
                    if line.startswith("dedupe_window_seconds{"):
                        value = float(line.rsplit(" ", 1)[1])
                        smallest = value if smallest is None else min(smallest, value)
        except (urllib.error.URLError, OSError, ValueError):
            pass
    return smallest


if __name__ == "__main__":
    sys.exit(main())
