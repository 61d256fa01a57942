"""Weights at line rate: the model cache's download against huggingface_hub's, in one run.

A fake Hub (e2e/support/fake_hub.py) on 127.0.0.1 serves two synthetic repositories from disk, with
a cap per connection standing for a CDN's cap on one stream:

  few-large   two large shards and the small files beside them (a few large files dominate)
  many-equal  many equal shards, like a 1.6 TB checkpoint scaled down

For each shape, in the same run:

  link              what loopback and the disk take together: the same server with no cap,
                    the bytes read over 16 connections and written to disk, nothing else
  ours-fetch        the download Job's script (programs/download.py) with its
                    defaults: its fetch phase, checksums included
  ours-fetch-nosum  the same with the checksums off (the benchmark's comparison only)
  ours              the script's whole run: interpreter start, listing, fetch, checksums
  hf-8              huggingface_hub's snapshot_download, default max_workers (8), whole run
  hf-32             the same with 32 workers
  hf-8+sha256       hf-8, then the sha256 pass a user would run to verify what it wrote

All of it twice: on loopback as fast as it goes, and with the link capped (--link-mbps, 800
MB/s by default: all connections together, a NIC slower than the cores can hash).
Each run starts from an empty cache on the same disk. huggingface_hub is the one vLLM 0.33.0
ships (the vllm tier's venv), with Xet off (the fake Hub serves plain HTTP). Prints figures
and the arithmetic for 1.6 TB; asserts nothing.

    .venv/bin/python bench/download.py [--gb 3] [--cap-mbps 100] [--link-mbps 800] [--keep]
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import threading
import time
from functools import cache

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "operator"))

from e2e.support.fake_hub import FakeHub  # noqa: E402

SCRIPT = ROOT / "operator" / "kimik3_operator" / "programs" / "download.py"
MB = 1_000_000
K3_BYTES = 1.6e12


@cache
def vllm_python() -> str:
    """The vllm tier's venv (scripts/vllm-venv.sh makes it once): its huggingface_hub."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm-venv.sh")], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def make_repo(folder: pathlib.Path, shards: list[int]) -> None:
    """Random shards (incompressible, like weights) and the small files of a checkpoint."""
    folder.mkdir(parents=True, exist_ok=True)
    block = 64 << 20
    for i, size in enumerate(shards, 1):
        path = folder / f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        with open(path, "wb") as out:
            left = size
            while left:
                piece = os.urandom(min(block, left))
                out.write(piece)
                left -= len(piece)
    (folder / "config.json").write_text(json.dumps({"architectures": ["KimiLinearForCausalLM"]}))
    (folder / "tokenizer.json").write_bytes(os.urandom(4 << 20).hex().encode()[: 4 << 20])
    index = {"weight_map": {f"layer.{i}": f"shard-{i}" for i in range(len(shards))}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def run_ours(
    hub: FakeHub, repo: str, cache: pathlib.Path, checksums: bool = True
) -> tuple[float, float]:
    """(the whole run, from the script's start; the fetch, from its first request)."""
    request = {
        "repos": [{"repo": repo, "revision": "main"}],
        "progressPort": free_port(),
        "checksums": checksums,
    }
    started = time.monotonic()
    done = subprocess.run(
        [vllm_python(), str(SCRIPT), json.dumps(request)],
        env=hub.client_env(cache),
        capture_output=True,
        text=True,
        check=False,
    )
    took = time.monotonic() - started
    report = json.loads(done.stdout.strip().splitlines()[-1])
    if report.get("phase") != "Ready":
        raise SystemExit(f"ours failed: {report} {done.stderr[-2000:]}")
    return took, float(report["fetchSeconds"])


HF = """
import sys, time
from huggingface_hub import snapshot_download
started = time.monotonic()
snapshot_download(sys.argv[1], revision="main", max_workers=int(sys.argv[2]))
print(time.monotonic() - started)
"""


def run_hf(hub: FakeHub, repo: str, cache: pathlib.Path, workers: int) -> float:
    started = time.monotonic()
    subprocess.run(
        [vllm_python(), "-c", HF, repo, str(workers)],
        env=hub.client_env(cache),
        capture_output=True,
        text=True,
        check=True,
    )
    return time.monotonic() - started


def sha_pass(cache: pathlib.Path) -> float:
    """What verifying hf's result takes: every blob read again and hashed."""
    started = time.monotonic()
    for path in cache.rglob("blobs/*"):
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            while chunk := handle.read(16 << 20):
                digest.update(chunk)
    return time.monotonic() - started


def run_link(hub: FakeHub, repo: str, cache: pathlib.Path, connections: int = 16) -> float:
    """The bytes over loopback into files on the same disk, nothing else: the ceiling."""
    files = list(hub.repos[repo].files.values())
    commit = hub.repos[repo].commit
    chunk = 16 << 20
    work = [(f, start) for f in files for start in range(0, max(f.size, 1), chunk)]
    lock = threading.Lock()
    cache.mkdir(parents=True, exist_ok=True)
    fds = {}
    for f in files:
        path = cache / f.sha256
        fds[f.name] = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        os.ftruncate(fds[f.name], f.size)

    def worker() -> None:
        conn = http.client.HTTPConnection(hub.host, hub.port, timeout=60)
        while True:
            with lock:
                if not work:
                    return
                f, start = work.pop(0)
            end = min(f.size, start + chunk)
            conn.request(
                "GET",
                f"/{repo}/resolve/{commit}/{f.name}",
                headers={"Range": f"bytes={start}-{end - 1}"},
            )
            response = conn.getresponse()
            at = start
            while piece := response.read1(1 << 20):
                os.pwrite(fds[f.name], piece, at)
                at += len(piece)
            response.close()

    started = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(connections)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - started
    for fd in fds.values():
        os.close(fd)
    return took


def measure(
    hub: FakeHub, shape: str, cap: float, base: pathlib.Path, link_cap: float
) -> tuple[str, int, dict[str, float]]:
    repo = f"bench/{shape}"
    total = sum(f.size for f in hub.repos[repo].files.values())

    def fresh() -> pathlib.Path:
        cache = base / "cache"
        shutil.rmtree(base / "cache", ignore_errors=True)
        shutil.rmtree(base / "home", ignore_errors=True)
        subprocess.run(["sync"], check=False)
        return cache

    hub.bytes_per_second = 0
    before = run_link(hub, repo, fresh())
    hub.bytes_per_second = cap
    # The best of three runs each: the page cache's writeback makes single runs noisy.
    ours, ours_fetch = min(run_ours(hub, repo, fresh()) for _ in range(3))
    bare_fetch = min(run_ours(hub, repo, fresh(), checksums=False)[1] for _ in range(3))
    cache = fresh()
    hf8 = run_hf(hub, repo, cache, 8)
    hf8_sha = hf8 + sha_pass(cache)
    hf32 = run_hf(hub, repo, fresh(), 32)
    hub.bytes_per_second = 0
    # The ceiling is the better of two measures, before and after the others.
    link = min(before, run_link(hub, repo, fresh()))
    fresh()
    # Whole runs (interpreter start, listing, fetch, checksums) side by side; the link
    # and the fetch phases alone against it.
    times = {"ours": ours, "hf-8": hf8, "hf-32": hf32, "hf-8+sha256": hf8_sha}
    phases = {"link": link, "ours-fetch": ours_fetch, "ours-fetch-nosum": bare_fetch}
    rate = {k: total / v / MB for k, v in {**phases, **times}.items()}
    print(f"{shape}: {total / 1e9:.2f} GB in {len(hub.repos[repo].files)} files")
    for name in [*phases, *times]:
        took = {**phases, **times}[name]
        print(
            f"  {name:17s} {took:7.1f} s  {rate[name]:7.0f} MB/s  "
            f"{rate[name] / rate['link']:5.2f} of the link"
        )
    print(
        f"  download (no checksums) / link {rate['ours-fetch-nosum'] / rate['link']:.2f}; "
        f"with checksums / link {rate['ours-fetch'] / rate['link']:.2f}; "
        f"checksums add {100 * (ours_fetch / bare_fetch - 1):.0f}% to the fetch "
        f"(hf's sha256 pass afterwards adds {100 * (hf8_sha / hf8 - 1):.0f}%)\n"
        f"  whole runs: ours / hf best {rate['ours'] / max(rate['hf-8'], rate['hf-32']):.2f}; "
        f"ours / hf default {rate['ours'] / rate['hf-8']:.2f}\n",
        flush=True,
    )
    return shape, total, {**phases, **times}


def main() -> None:
    parser = argparse.ArgumentParser()
    # Both repositories and one download fit the page cache of a 24 GB machine, so the runs
    # measure the transfer, not the disk's writeback of the run before.
    parser.add_argument("--gb", type=float, default=3.0, help="size of each repository")
    parser.add_argument("--cap-mbps", type=float, default=100.0, help="MB/s per connection")
    parser.add_argument("--link-mbps", type=float, default=800.0, help="the capped link's rate")
    parser.add_argument("--dir", default="/var/tmp/kk3-download-bench")
    parser.add_argument("--keep", action="store_true", help="keep the repositories for next time")
    args = parser.parse_args()
    base = pathlib.Path(args.dir)
    shutil.rmtree(base / "cache", ignore_errors=True)
    size = int(args.gb * 1e9)
    shapes = {
        "few-large": [size // 2, size - size // 2],
        "many-equal": [size // 48] * 48,
    }
    hub = FakeHub()
    print(f"making {len(shapes)} repositories of {args.gb:.1f} GB on {base} ...", flush=True)
    for shape, shards in shapes.items():
        made = base / "hub" / shape
        if sorted(p.stat().st_size for p in made.glob("model-*")) != sorted(shards):
            shutil.rmtree(made, ignore_errors=True)
            make_repo(made, shards)
        hub.add_repo_from_disk(f"bench/{shape}", base / "hub" / shape)
    hub.start()
    cap = args.cap_mbps * MB
    print(
        f"cap per connection {args.cap_mbps:.0f} MB/s; ours uses its defaults; "
        f"{os.cpu_count()} CPUs; the server and the clients share them\n"
    )
    rows = []
    for link_cap in (0.0, args.link_mbps * MB):
        hub.link_bytes_per_second = link_cap
        print(
            "the link: loopback and the disk, as fast as they go"
            if not link_cap
            else f"the link capped at {args.link_mbps:.0f} MB/s for all connections together "
            "(a NIC slower than the cores can hash)",
            flush=True,
        )
        for shape in shapes:
            rows.append(measure(hub, shape, cap, base, link_cap))
    hub.stop()
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
    print("1.6 TB at these rates (per-connection cap as above), both links in turn:")
    for shape, total, times in rows:
        line = ", ".join(f"{k} {K3_BYTES / (total / v) / 60:.0f} min" for k, v in times.items())
        print(f"  {shape}: {line}")


if __name__ == "__main__":
    main()
