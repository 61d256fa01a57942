"""Runs ``vllm serve`` in the serving container and, when it exits with an error, writes its
decisive lines to the termination log, so the pod's status says why it stopped.

vLLM prints the root cause of a start-up failure (the engine core's traceback) about 10 KB
before its last line, further back than the 2 KB a kubelet keeps with
``FallbackToLogsOnError``. This launcher passes every line through to the container's log
unchanged, keeps the lines that name an error, and on a non-zero exit writes those and the
last lines (at most 4 KiB, the kubelet's own limit). SIGTERM and SIGINT go to vLLM (and a
stop on request writes nothing), and its exit code is the container's. Standard library
only: it runs in the user's vLLM image, given inline to ``python3 -c``.
"""

import collections
import os
import re
import signal
import subprocess
import sys

LOG = os.environ.get("KIMIK3_TERMINATION_LOG", "/dev/termination-log")
LIMIT = 4096
LINE = 500
ERROR = re.compile(r"(Error|Exception|error:)\b")


def main(argv: list[str]) -> int:
    child = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    stopping = []

    def forward(number: int, _frame: object) -> None:
        stopping.append(number)
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
