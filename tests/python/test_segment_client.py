"""The tracking API against Segment's own Python client (segment-analytics-python), and the
scenario dedupe exists for: a response lost after Kafka acknowledged makes the client retry with
the same messageIds, so the input topic holds duplicates, which the worker removes; and a batch
with one invalid message, which costs only itself.

Needs: the `dedupe` binary ($DEDUPE_BIN, else $CARGO_TARGET_DIR/release/dedupe), the local broker
(deploy/local/kafka.sh up; $DEDUPE_TEST_BROKERS to point elsewhere), kcat, and Java for Kafka's
own TopicCommand (the broker does not create topics on its own). A missing piece fails the test
with a message naming it; nothing is skipped.

Run: deploy/local/test.sh, or
  /var/tmp/dedupe-venv/bin/python -m pytest tests/python -k "not worker"
"""

import collections
import contextlib
import gzip
import json
import os
import re
import socket
import subprocess
import tempfile
import threading
import time
import uuid
import http.client
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from segment.analytics.client import Client

REPO = Path(__file__).resolve().parents[2]
BROKERS = os.environ.get("DEDUPE_TEST_BROKERS", "127.0.0.1:9092")
TARGET = os.environ.get("CARGO_TARGET_DIR", "/var/tmp/dedupe-target")
DEDUPE = os.environ.get("DEDUPE_BIN", os.path.join(TARGET, "release", "dedupe"))
WRITE_KEY = "pytest-write-key"
SOURCE = "python"


def run(cmd, timeout=120, **kwargs):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kwargs)
    except FileNotFoundError as e:
        pytest.fail(f"cannot run {cmd[0]}: {e}")


@pytest.fixture(scope="session")
def dedupe_bin():
    if not os.access(DEDUPE, os.X_OK):
        pytest.fail(f"the dedupe binary is not at {DEDUPE}: build it with `cargo build --release -p dedupe-cli`")
    return DEDUPE


@pytest.fixture(scope="session")
def kafka_classpath():
    out = run(["bash", str(REPO / "deploy/local/kafka.sh"), "classpath"])
    if out.returncode != 0 or not out.stdout.strip():
        pytest.fail(f"cannot get Kafka's classpath from deploy/local/kafka.sh: {out.stderr}")
    return out.stdout.strip()


def topic_command(classpath, *args):
    out = run(["java", "-Xmx256m", "-cp", classpath, "org.apache.kafka.tools.TopicCommand",
               "--bootstrap-server", BROKERS, *args])
    if out.returncode != 0:
        pytest.fail(f"TopicCommand {' '.join(args)} failed: {out.stdout}\n{out.stderr}")


@pytest.fixture
def make_topic(kafka_classpath):
    """Creates uniquely named topics and deletes them after the test, with the dead-letter topic
    a front door made for one and the id changelog a worker made for one."""
    made = []

    def make(prefix, partitions=3):
        name = f"{prefix}-{uuid.uuid4().hex}"
        topic_command(kafka_classpath, "--create", "--topic", name, "--partitions", str(partitions),
                      "--replication-factor", "1")
        made.append(name)
        return name

    yield make
    for name in made:
        # A regular expression: the topic, `<topic>.dead-letter` and `<topic>.ids` where they exist.
        run(["java", "-Xmx256m", "-cp", kafka_classpath, "org.apache.kafka.tools.TopicCommand",
             "--bootstrap-server", BROKERS, "--delete", "--topic", name + r"(\.dead-letter|\.ids)?"])


def headers_of(record):
    """A record's headers, as kcat's JSON lists them (name, value, name, value...), by name."""
    h = record["headers"] or []
    return dict(zip(h[0::2], h[1::2]))


def read_topic(topic, read_committed=False):
    """Every record of `topic`, read to the end of each partition with kcat."""
    cmd = ["kcat", "-C", "-b", BROKERS, "-t", topic, "-e", "-J", "-q"]
    if read_committed:
        cmd += ["-X", "isolation.level=read_committed"]
    out = run(cmd, timeout=60)
    if out.returncode != 0:
        pytest.fail(f"kcat could not read {topic}: {out.stderr}")
    return [json.loads(line) for line in out.stdout.splitlines() if line.strip()]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(port, path):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


@contextlib.contextmanager
def ingest(dedupe_bin, topic):
    """A running `dedupe ingest` for `topic`; yields its base URL."""
    port = free_port()
    env = dict(os.environ, DEDUPE_WRITE_KEYS=f"{WRITE_KEY}={SOURCE}")
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen([dedupe_bin, "ingest", "--listen", f"127.0.0.1:{port}", "--brokers", BROKERS,
                                 "--topic", topic, "--metrics-addr", f"127.0.0.1:{free_port()}"], env=env, stdout=log, stderr=log)

        def log_text():
            log.seek(0)
            return log.read().decode(errors="replace")

        try:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(OSError):
                    if get(port, "/readyz") == 200:
                        break
                if proc.poll() is not None:
                    pytest.fail(f"dedupe ingest exited with {proc.returncode}:\n{log_text()}")
                if time.monotonic() > deadline:
                    pytest.fail(f"dedupe ingest was not ready within 30 s:\n{log_text()}")
                time.sleep(0.1)
            yield f"http://127.0.0.1:{port}"
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            assert WRITE_KEY not in log_text(), "the write key was logged"


# A request as the proxy saw it: X-Retry-Count, its messageIds, the ingest's status and answer
# (JSON), and whether the answer was kept from the client.
Request = collections.namedtuple("Request", ["retry_count", "ids", "status", "dropped", "answer"])


class Proxy:
    """A loopback HTTP proxy in front of the ingest that records every request. It forwards each
    one; with `drop_first_response`, for the first one the ingest answers 200 (so Kafka holds the
    messages), it closes the client's connection instead of passing the answer on, as a lost
    response would."""

    def __init__(self, upstream_port, drop_first_response=True):
        self.requests = []  # Request, in arrival order
        self.lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                conn.request("POST", self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                conn.close()
                raw = gzip.decompress(body) if self.headers.get("Content-Encoding") == "gzip" else body
                ids = [m.get("messageId") for m in json.loads(raw).get("batch", [])]
                try:
                    answer = json.loads(data)
                except ValueError:
                    answer = None
                with proxy.lock:
                    drop = drop_first_response and resp.status == 200 and not any(r.dropped for r in proxy.requests)
                    proxy.requests.append(Request(self.headers.get("X-Retry-Count"), ids, resp.status, drop, answer))
                if drop:
                    # The ingest answered 200; the client never hears it.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.send_response(resp.status)
                self.send_header("Content-Type", resp.getheader("Content-Type", "application/json"))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def client(host, errors, **kwargs):
    """A Segment client tuned for a test: quick uploads and quick retries (`kwargs` override)."""
    settings = {"upload_interval": 0.2, "max_retries": 3, "timeout": 10, **kwargs}
    return Client(WRITE_KEY, host=host, on_error=lambda e, batch: errors.append(repr(e)), **settings)


def send_one_of_each(c, tag):
    """Sends every message type; returns the messages as the client queued them."""
    sent = [
        c.track(user_id=f"u-{tag}", event="Song Played", properties={"tag": tag}),
        c.identify(user_id=f"u-{tag}", traits={"plan": "pro"}),
        c.page(anonymous_id=f"a-{tag}", name="Home"),
        c.screen(user_id=f"u-{tag}", name="Feed"),
        c.group(user_id=f"u-{tag}", group_id="g-1", traits={"name": "Team"}),
        c.alias(previous_id=f"a-{tag}", user_id=f"u-{tag}"),
    ]
    assert all(ok for ok, _ in sent), "the client refused to queue a message"
    return [msg for _, msg in sent]


def by_message_id(records):
    out = {}
    for r in records:
        out.setdefault(json.loads(r["payload"])["messageId"], []).append(r)
    return out


@pytest.mark.parametrize("use_gzip", [False, True])
def test_client_events_arrive(dedupe_bin, make_topic, use_gzip):
    topic = make_topic("py-client")
    errors = []
    with ingest(dedupe_bin, topic) as url:
        c = client(url, errors, gzip=use_gzip)
        sent = send_one_of_each(c, "arrive")
        c.flush()
        c.join()
    assert errors == [], errors

    records = read_topic(topic)
    assert len(records) == len(sent)
    got = by_message_id(records)
    for msg in sent:
        [record] = got[msg["messageId"]]
        # Keyed <source>:<messageId>, with the source header and the content digest (16 hex
        # digits), and the client's fields as sent.
        assert record["key"] == f"{SOURCE}:{msg['messageId']}"
        headers = record["headers"]
        assert headers[:3] == ["dedupe-source", SOURCE, "dedupe-content-digest"], headers
        assert len(headers) == 4 and re.fullmatch(r"[0-9a-f]{16}", headers[3]), headers
        value = json.loads(record["payload"])
        assert value["type"] == msg["type"]
        assert value["timestamp"] == msg["timestamp"]
        assert value["context"]["library"]["name"] == "analytics-python"
        assert value["receivedAt"].endswith("Z")
        assert "sentAt" in value and "writeKey" not in value


def retry_scenario(dedupe_bin, topic):
    """Sends a batch through the dropping proxy; returns (messages sent, proxy log)."""
    errors = []
    with ingest(dedupe_bin, topic) as url:
        upstream_port = int(url.rsplit(":", 1)[1])
        with Proxy(upstream_port) as proxy:
            c = client(f"http://127.0.0.1:{proxy.port}", errors)
            sent = send_one_of_each(c, "retry")
            c.flush()
            c.join()
    assert errors == [], f"the client gave up: {errors}"
    return sent, proxy.requests


def test_lost_response_is_retried_and_duplicates_reach_the_input_topic(dedupe_bin, make_topic):
    topic = make_topic("py-retry-in")
    sent, requests = retry_scenario(dedupe_bin, topic)

    # The first request reached Kafka but its answer was dropped; the client sent the same
    # messageIds again, saying it was a retry.
    dropped = [r for r in requests if r.dropped]
    assert len(dropped) == 1, requests
    dropped_ids = dropped[0].ids
    retries = [r for r in requests if r.retry_count not in (None, "0")]
    assert retries and set(dropped_ids) <= {i for r in retries for i in r.ids}, requests
    assert all(r.status == 200 for r in requests), requests

    # So the input topic holds every dropped message twice, and every message at least once.
    got = by_message_id(read_topic(topic))
    assert set(got) == {m["messageId"] for m in sent}
    for message_id, records in got.items():
        expected = 2 if message_id in dropped_ids else 1
        assert len(records) == expected, f"{message_id}: {len(records)} copies, expected {expected}"
        # Both copies are the same message under the same key, so one partition.
        assert len({(r["key"], r["partition"]) for r in records}) == 1


def dedupe_and_verify(dedupe_bin, input_topic, output_topic, expected_ids, data_dir):
    """Runs `dedupe run` from `input_topic` to `output_topic` until the output holds as many
    messages as `expected_ids`, then stops it: the output must hold each of them exactly once, and
    `dedupe verify` must agree."""
    common = ["--brokers", BROKERS, "--input-topic", input_topic, "--output-topic", output_topic]
    with tempfile.TemporaryFile() as log:
        # A consumer group of its own, so no other run's committed offsets apply.
        env = dict(os.environ, DEDUPE_WORKER_GROUP_ID=f"py-worker-{uuid.uuid4().hex}")
        worker = subprocess.Popen([dedupe_bin, "run", *common, "--data-dir", str(data_dir),
                                   "--metrics-addr", f"127.0.0.1:{free_port()}"], env=env, stdout=log, stderr=log)

        def log_text():
            log.seek(0)
            return log.read().decode(errors="replace")

        try:
            deadline = time.monotonic() + 60
            while len(read_topic(output_topic, read_committed=True)) < len(expected_ids):
                if worker.poll() is not None:
                    pytest.fail(f"dedupe run exited with {worker.returncode}:\n{log_text()}")
                assert time.monotonic() < deadline, f"the worker did not publish every message within 60 s:\n{log_text()}"
                time.sleep(0.5)
        finally:
            worker.terminate()
            worker.wait(timeout=30)

    got = by_message_id(read_topic(output_topic, read_committed=True))
    assert set(got) == set(expected_ids)
    assert all(len(records) == 1 for records in got.values()), {k: len(v) for k, v in got.items()}
    verify = run([dedupe_bin, "verify", *common])
    assert verify.returncode == 0, f"dedupe verify failed:\n{verify.stdout}\n{verify.stderr}"


def test_retry_duplicates_removed_by_worker(dedupe_bin, make_topic, tmp_path):
    """The second half of the scenario: after `dedupe run`, the output topic holds each message
    exactly once."""
    input_topic = make_topic("py-retry-in")
    output_topic = make_topic("py-retry-out")
    sent, _ = retry_scenario(dedupe_bin, input_topic)
    assert len(read_topic(input_topic)) > len(sent), "the scenario made no duplicates"
    dedupe_and_verify(dedupe_bin, input_topic, output_topic, {m["messageId"] for m in sent}, tmp_path / "ledger")


def test_an_invalid_message_costs_only_itself_and_the_nine_pass_the_worker_once(dedupe_bin, make_topic, tmp_path):
    """A batch of ten whose fifth message has a 300-character messageId: the client takes any
    string as an id, the tracking API at most 256 bytes (`bad_message_id`). The answer is 200
    naming the fifth, so the client reports no error; the nine valid messages are in the input
    topic once each, the fifth in the dead-letter topic with its reason, and after `dedupe run`
    the output holds the nine once each. The ten go out in one request, so a front door that
    refused the whole batch would fail this test."""
    invalid_index = 4
    long_id = f"{uuid.uuid4().hex}-".ljust(300, "x")
    input_topic = make_topic("py-invalid-in")
    output_topic = make_topic("py-invalid-out")
    errors = []
    with ingest(dedupe_bin, input_topic) as url:
        with Proxy(int(url.rsplit(":", 1)[1]), drop_first_response=False) as proxy:
            # The consumer starts a batch when the client is made and takes what is queued within
            # upload_interval, up to upload_size: the ten are queued within milliseconds, so they
            # go out as one batch, and join() waits at most upload_interval for the consumer.
            c = client(f"http://127.0.0.1:{proxy.port}", errors, upload_size=10, upload_interval=1)
            sent = []
            for i in range(10):
                ok, msg = c.track(user_id="u-py", event="Clicked", properties={"i": i},
                                  message_id=long_id if i == invalid_index else None)
                assert ok, "the client refused to queue a message"
                sent.append(msg)
            c.flush()
            c.join()
    assert errors == [], f"the client reported errors: {errors}"
    assert sent[invalid_index]["messageId"] == long_id, "the client changed the messageId"
    valid_ids = {m["messageId"] for i, m in enumerate(sent) if i != invalid_index}

    # One request carried the ten, once, and was answered 200 naming the fifth.
    assert len(proxy.requests) == 1, proxy.requests
    [request] = proxy.requests
    assert request.ids == [m["messageId"] for m in sent], request
    assert (request.status, request.retry_count in (None, "0")) == (200, True), request
    assert request.answer["success"] is True, request.answer
    [rejected] = request.answer["rejected"]
    assert (rejected["index"], rejected["code"]) == (invalid_index, "bad_message_id"), request.answer
    assert rejected["message"].startswith(f"batch[{invalid_index}]: "), request.answer

    # The input topic holds the nine once each; the dead-letter topic the fifth alone, as sent,
    # with why and where; an id the API cannot use keys nothing.
    got = by_message_id(read_topic(input_topic))
    assert set(got) == valid_ids, "the input topic does not hold the nine valid messages alone"
    assert all(len(records) == 1 for records in got.values()), {k: len(v) for k, v in got.items()}
    [letter] = read_topic(f"{input_topic}.dead-letter")
    headers = headers_of(letter)
    assert headers["dedupe-reason"] == "bad_message_id", headers
    assert headers["dedupe-index"] == str(invalid_index), headers
    assert (headers["dedupe-endpoint"], headers["dedupe-source"]) == ("batch", SOURCE), headers
    assert headers["dedupe-error"].startswith(f"batch[{invalid_index}]: "), headers
    assert letter["key"] is None, letter
    value = json.loads(letter["payload"])
    assert (value["messageId"], value["event"], value["properties"]) == (long_id, "Clicked", {"i": invalid_index}), value
    assert value["context"]["library"]["name"] == "analytics-python" and "writeKey" not in value, value

    dedupe_and_verify(dedupe_bin, input_topic, output_topic, valid_ids, tmp_path / "ledger")
