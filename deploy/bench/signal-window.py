#!/usr/bin/env python3
"""How long after `exec` a SIGTERM still ends `dedupe run` by its default action.

Starts `dedupe run` (against a broker address nothing listens on, so the start waits) and sends
SIGTERM at fixed delays after `posix_spawn` returns (glibc's posix_spawn returns once the child
has exec'd), TRIES times each; a start the signal killed ends by SIGTERM, one that caught it
exits 0. Prints one JSON object: per delay (ms), how many starts were killed. Run as a process of
its own, never as the container's PID 1 (the kernel discards a default-action signal to PID 1).

    deploy/bench/signal-window.py [DEDUPE_BIN] [TRIES]
"""

import json
import os
import signal
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else "/var/tmp/dedupe-target/release/dedupe"
TRIES = int(sys.argv[2]) if len(sys.argv) > 2 else 10
DELAYS_MS = [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, 3.0, 5.0]


def one(delay_ms: float, data_dir: str) -> str:
    args = [BIN, "run", "--brokers", "127.0.0.1:1", "--input-topic", "in", "--output-topic",
            "out", "--data-dir", data_dir, "--metrics-addr", "127.0.0.1:0"]
    env = {"PATH": "/usr/bin:/bin", "RUST_LOG": "off"}
    pid = os.posix_spawn(BIN, args, env)
    deadline = time.perf_counter() + delay_ms / 1000.0
    while time.perf_counter() < deadline:
        pass
    os.kill(pid, signal.SIGTERM)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return "killed"
    return "caught" if os.WEXITSTATUS(status) == 0 else f"exit {os.WEXITSTATUS(status)}"


def main() -> None:
    result = {"tries": TRIES, "killed_by_delay_ms": {}, "other": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for delay in DELAYS_MS:
            outcomes = [one(delay, os.path.join(tmp, f"l-{delay}-{i}")) for i in range(TRIES)]
            result["killed_by_delay_ms"][str(delay)] = outcomes.count("killed")
            other = [o for o in outcomes if o not in ("killed", "caught")]
            if other:
                result["other"][str(delay)] = other
    print(json.dumps(result))


if __name__ == "__main__":
    main()
