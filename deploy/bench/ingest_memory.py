#!/usr/bin/env python3
"""The front door's memory at its limits: what `ingest.max_in_flight_requests` places and the
connections' half-sent bodies hold at worst.

Starts `dedupe ingest` with its defaults (a throw-away input topic on the local broker), then for
DURATION seconds keeps every in-flight place busy with the largest requests a client can send
(500 KB decoded: 5,000 events beside a shared context merged into each, so about 1 MB of records,
gzip on the wire) while other connections hold keyed bodies of 490 KB that never finish (each
until its request timeout, then again). Prints one JSON line: idle and peak resident memory, and
the peak per place. Usage:

    deploy/local/kafka.sh up
    DEDUPE_BIN=target/release/dedupe deploy/bench/ingest_memory.py [--places 64] [--stalled 400]
"""

import argparse
import base64
import gzip
import http.client
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid

KEY = "bench-memory-key"


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def status_kib(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def largest_body():
    context = {"library": {"name": "analytics-python", "version": "2.3.3"}, "locale": "de-DE", "pad": "c" * 40}
    events = [{"type": "track", "event": "e", "userId": f"u{i}"} for i in range(5000)]
    body = json.dumps({"batch": events, "context": context}).encode()
    assert len(body) < 500 * 1024, len(body)
    return gzip.compress(body)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--places", type=int, default=64, help="ingest.max_in_flight_requests (the default)")
    ap.add_argument("--stalled", type=int, default=400, help="connections holding half-sent keyed bodies")
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--brokers", default=os.environ.get("DEDUPE_BROKERS", "127.0.0.1:9092"))
    args = ap.parse_args()
    binary = os.environ.get("DEDUPE_BIN", "target/release/dedupe")
    topic = f"bench-memory-{uuid.uuid4().hex[:12]}"
    here = os.path.dirname(os.path.abspath(__file__))
    kafka_sh = os.path.join(here, "..", "local", "kafka.sh")
    subprocess.run([kafka_sh, "create-topic", topic, "6"], check=True, capture_output=True)
    port = free_port()
    env = dict(os.environ, DEDUPE_WRITE_KEYS=f"{KEY}=bench", DEDUPE_LOG_LEVEL="warn",
               DEDUPE_INGEST_MAX_IN_FLIGHT_REQUESTS=str(args.places))
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([binary, "ingest", "--listen", f"127.0.0.1:{port}", "--brokers", args.brokers,
                             "--topic", topic], env=env, stdout=log, stderr=log)
    auth = "Basic " + base64.b64encode(f"{KEY}:".encode()).decode()
    try:
        deadline = time.time() + 30
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                log.seek(0)
                sys.exit("dedupe ingest did not become ready:\n" + log.read().decode(errors="replace"))
            time.sleep(0.2)
        idle = status_kib(proc.pid, "VmRSS")
        body = largest_body()
        stop = threading.Event()
        answers = {}
        lock = threading.Lock()

        def sender():
            while not stop.is_set():
                try:
                    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    c.request("POST", "/v1/batch", body, {"Authorization": auth, "Content-Type": "application/json",
                                                         "Content-Encoding": "gzip"})
                    status = c.getresponse().status
                    c.close()
                except OSError:
                    status = "error"
                with lock:
                    answers[status] = answers.get(status, 0) + 1

        def staller():
            head = (f"POST /v1/batch HTTP/1.1\r\nHost: x\r\nAuthorization: {auth}\r\n"
                    f"Content-Type: application/json\r\nContent-Length: {500 * 1024}\r\n\r\n").encode()
            part = b"{" + b" " * (490 * 1024)
            while not stop.is_set():
                try:
                    s = socket.create_connection(("127.0.0.1", port), timeout=10)
                    s.sendall(head + part)
                    s.settimeout(10)
                    s.recv(4096)  # the 408, after the request timeout
                    s.close()
                except OSError:
                    time.sleep(0.1)

        threads = [threading.Thread(target=sender) for _ in range(args.places)]
        threads += [threading.Thread(target=staller) for _ in range(args.stalled)]
        for t in threads:
            t.daemon = True
            t.start()
        peak_rss = idle
        end = time.time() + args.duration
        while time.time() < end:
            peak_rss = max(peak_rss, status_kib(proc.pid, "VmRSS"))
            time.sleep(0.1)
        stop.set()
        hwm = status_kib(proc.pid, "VmHWM")
        print(json.dumps({
            "places": args.places, "stalled_connections": args.stalled, "body_gzip_bytes": len(body),
            "idle_rss_mib": round(idle / 1024, 1), "peak_rss_mib": round(max(peak_rss, hwm) / 1024, 1),
            "per_place_mib": round((max(peak_rss, hwm) - idle) / 1024 / args.places, 2),
            "answers": {str(k): v for k, v in answers.items()},
        }))
    finally:
        proc.kill()
        proc.wait()
        # The throw-away topics are left to the local broker, which the tests' topics share.


if __name__ == "__main__":
    main()
