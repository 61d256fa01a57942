"""Runs ``vllm serve`` in the serving container and, when it exits with an error, writes its
decisive lines to the termination log, so the pod's status says why it stopped.

vLLM prints the root cause of a start-up failure (the engine core's traceback) about 10 KB
before its last line, further back than the 2 KB a kubelet keeps with
``FallbackToLogsOnError``. This launcher passes every line through to the container's log
unchanged, keeps the lines that name an error, and on a non-zero exit writes those and the
last lines (at most 4 KiB, the kubelet's own limit). SIGTERM and SIGINT go to vLLM (and a
stop on request writes nothing), and its exit code is the container's. Standard library
only: it runs in the user's vLLM image, given inline to ``python3 -c``.

A stop drains first (KIMIK3_DRAIN_URL, KIMIK3_DRAIN_SECONDS): a pod being deleted (a group
removed by a scale-down) has left its Service's endpoints, so no new request reaches it, but
vLLM aborts the requests still running when it gets SIGTERM. So SIGTERM is held until the
leader's /metrics show no request running or waiting, the leader cannot be reached, or the
drain's seconds are up; a worker watches its group's leader (LWS_LEADER_ADDRESS), since its
shard serves the leader's requests. A second signal goes to vLLM at once.
"""

import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

LOG = os.environ.get("KIMIK3_TERMINATION_LOG", "/dev/termination-log")
LIMIT = 4096
LINE = 500
ERROR = re.compile(r"(Error|Exception|error:)\b")
IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")
# Time for the endpoint's removal to reach the proxies before the drain is read.
SETTLE_SECONDS = float(os.environ.get("KIMIK3_DRAIN_SETTLE_SECONDS", "5"))


def in_flight(url: str) -> float | None:
    """Requests running or waiting at the leader; None when it cannot be read."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            text = response.read(4 << 20).decode("utf-8", "replace")
    except (OSError, ValueError):
        return None
    total = 0.0
    for line in text.splitlines():
        if line.startswith(IN_FLIGHT):
            try:
                total += float(line.rsplit(" ", 1)[-1])
            except ValueError:
                continue
    return total


def drain_url() -> str:
    url = os.environ.get("KIMIK3_DRAIN_URL", "")
    return url.replace("{leader}", os.environ.get("LWS_LEADER_ADDRESS", "127.0.0.1"))


def drain(url: str, seconds: float) -> None:
    """Returns once nothing runs or waits at ``url``, it cannot be read, or ``seconds``
    have passed."""
    deadline = time.monotonic() + seconds
    time.sleep(min(SETTLE_SECONDS, seconds))
    while time.monotonic() < deadline:
        if not in_flight(url):
            return
        time.sleep(1.0)


def main(argv: list[str]) -> int:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stopping = []

    url = drain_url()
    seconds = float(os.environ.get("KIMIK3_DRAIN_SECONDS", "0") or 0)

    def drained(number: int) -> None:
        drain(url, seconds)
        child.send_signal(number)

    def forward(number: int, _frame: object) -> None:
        stopping.append(number)
        if len(stopping) == 1 and url and seconds > 0:
            threading.Thread(target=drained, args=(number,), daemon=True).start()
        else:
            child.send_signal(number)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    errors: collections.deque[str] = collections.deque(maxlen=12)
    tail: collections.deque[str] = collections.deque(maxlen=12)
    out = sys.stdout.buffer
    assert child.stdout is not None
    for raw in child.stdout:
        out.write(raw)
        out.flush()
        line = raw.decode("utf-8", "replace").rstrip()[:LINE]
        if not line.strip():
            continue
        tail.append(line)
        if ERROR.search(line) and line not in errors:
            errors.append(line)
    code = child.wait()
    if code != 0 and not stopping:  # a stop on request is not a failure to explain
        text = "\n".join([*errors, "--- last lines:", *tail]).encode("utf-8", "replace")
        try:
            with open(LOG, "wb") as log:
                log.write(text[-LIMIT:])
        except OSError:
            pass
    return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
