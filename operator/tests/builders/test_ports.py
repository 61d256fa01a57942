"""The fixed loopback ports of the test cluster, the demo and the benchmarks: each one named
in one place only, and all below the kernel's ephemeral range, so that a benchmark run beside
the tests, or a port a test takes from the kernel (bind to port 0), never collides with one."""

from __future__ import annotations

import pathlib
import re
from collections import defaultdict

ROOT = pathlib.Path(__file__).resolve().parents[3]
FIXED = re.compile(
    r"127\.0\.0\.1:(\d{4,5})\b|PORT:-(\d{4,5})\b|--port[\" ,]+(?:type=int, default=)?(\d{4,5})\b"
    r"|\"--port\", type=int, default=(\d{4,5})\b"
)
# The start of Linux's default ephemeral range (net.ipv4.ip_local_port_range).
EPHEMERAL = 32768


def fixed_ports() -> dict[int, set[str]]:
    found: dict[int, set[str]] = defaultdict(set)
    for folder in ("e2e", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*")):
            if path.suffix not in (".py", ".sh") or ".run" in path.parts:
                continue
            for match in FIXED.finditer(path.read_text()):
                port = int(next(group for group in match.groups() if group))
                found[port].add(str(path.relative_to(ROOT)))
    return found


def test_the_scan_finds_the_known_ports() -> None:
    ports = fixed_ports()
    assert ports[19443] == {"e2e/cluster/up.sh"}  # the LWS webhook
    assert "bench/scale.py" in ports[19603]


def test_each_fixed_port_is_named_in_one_file_below_the_ephemeral_range() -> None:
    ports = fixed_ports()
    shared = {port: files for port, files in ports.items() if len(files) > 1}
    assert not shared, f"a fixed port claimed in more than one file: {shared}"
    high = sorted(port for port in ports if port >= EPHEMERAL)
    assert not high, f"fixed ports inside the ephemeral range, where bind(0) may take them: {high}"
