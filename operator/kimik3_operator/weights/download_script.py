"""Fills the model cache: run by the download Job in the serving image (which has
huggingface_hub, as vLLM needs it), never by the operator.

Usage: python3 download_script.py '<request json>'
Request: {"repos": [{"repo": ..., "revision": ...}], "verifyOnly": bool, "progressPort": int}

For each repository at its revision: asks the Hub for the files with their sizes and
checksums, downloads each into HF_HUB_CACHE's blobs under a stable partial name (so a killed
pod's successor resumes with a Range request: huggingface_hub itself restarts a killed
download from zero), lets huggingface_hub lay out the snapshot and the revision's ref (so vLLM
in the serving pods finds them offline), then checks every file's size and checksum (sha256
for LFS files, the git blob id for the rest).
A verified snapshot leaves a marker, so a later Job for it checks sizes only.
While it runs, GET :progressPort/progress answers {phase, bytesDone, bytesTotal, ...}.
At the end the report goes to /dev/termination-log (the operator reads it from the pod).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

TERMINATION_LOG = "/dev/termination-log"
MARKERS = ".kimik3-verified"
HASH_CHUNK = 16 * 1024 * 1024
FETCH_CHUNK = 1024 * 1024
FETCH_ATTEMPTS = 5


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int
    sha256: str  # empty when the file is not in LFS
    blob_id: str

    @property
    def blob(self) -> str:
        """The file's name in the cache's blobs/ directory."""
        return self.sha256 or self.blob_id


@dataclass
class Plan:
    repo: str
    revision: str
    commit: str
    files: list[RepoFile]


@dataclass
class Progress:
    phase: str = "Resolving"
    bytes_total: int = 0
    verified_bytes: int = 0
    files_total: int = 0
    message: str = ""
    started: float = field(default_factory=time.time)
    plans: list[Plan] = field(default_factory=list)
    cache_dir: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bytes_done(self) -> int:
        """Bytes on disk for the planned files: whole blobs plus partial ones."""
        done = 0
        for plan in self.plans:
            blobs = os.path.join(self.cache_dir, repo_folder(plan.repo), "blobs")
            for f in plan.files:
                for candidate in (f.blob, f.blob + ".incomplete"):
                    try:
                        done += min(f.size, os.path.getsize(os.path.join(blobs, candidate)))
                        break
                    except OSError:
                        continue
        return done

    def snapshot(self) -> dict[str, Any]:
        with self.lock:
            if self.phase == "Downloading":
                done = self.bytes_done()
            else:
                done = self.bytes_total if self.phase in ("Verifying", "Ready") else 0
            return {
                "phase": self.phase,
                "bytesDone": done,
                "bytesTotal": self.bytes_total,
                "verifiedBytes": self.verified_bytes,
                "filesTotal": self.files_total,
                "elapsedSeconds": round(time.time() - self.started, 1),
                "message": self.message,
            }


def repo_folder(repo: str) -> str:
    return "models--" + repo.replace("/", "--")


def git_blob_id(path: str, size: int) -> str:
    digest = hashlib.sha1(f"blob {size}\0".encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_of(path: str, progress: Progress) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
            with progress.lock:
                progress.verified_bytes += len(chunk)
    return digest.hexdigest()


def fetch(url: str, headers: dict[str, str], blob: str, size: int) -> None:
    """One file into its blob, resuming from the partial file a killed pod left."""
    import urllib.request

    if os.path.exists(blob) and os.path.getsize(blob) == size:
        return
    partial = blob + ".incomplete"
    for attempt in range(FETCH_ATTEMPTS):
        have = os.path.getsize(partial) if os.path.exists(partial) else 0
        if have > size:
            os.remove(partial)
            have = 0
        if have < size:
            wanted = dict(headers, **({"Range": f"bytes={have}-"} if have else {}))
            try:
                with urllib.request.urlopen(
                    urllib.request.Request(url, headers=wanted), timeout=60
                ) as response:
                    if have and response.status != 206:
                        have = 0  # the server ignored the range: start over
                    with open(partial, "ab" if have else "wb") as out:
                        while chunk := response.read(FETCH_CHUNK):
                            out.write(chunk)
            except OSError:
                if attempt == FETCH_ATTEMPTS - 1:
                    raise
                time.sleep(2**attempt)
                continue
        if os.path.getsize(partial) == size:
            os.replace(partial, blob)
            return
    raise OSError(f"{url}: {os.path.getsize(partial)} of {size} bytes after {FETCH_ATTEMPTS} tries")


def fetch_plan(plan: Plan, cache_dir: str, workers: int = 8) -> None:
    from huggingface_hub import hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    headers = build_hf_headers()
    blobs = os.path.join(cache_dir, repo_folder(plan.repo), "blobs")
    os.makedirs(blobs, exist_ok=True)

    def one(f: RepoFile) -> None:
        url = hf_hub_url(plan.repo, f.name, revision=plan.commit)
        fetch(url, headers, os.path.join(blobs, f.blob), f.size)

    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, [f for f in plan.files if f.blob]))


def resolve(api: Any, repo: str, revision: str) -> Plan:
    info = api.model_info(repo, revision=revision, files_metadata=True)
    files = [
        RepoFile(
            s.rfilename,
            int(s.size or 0),
            (s.lfs or {}).get("sha256", "") if s.lfs else "",
            s.blob_id or "",
        )
        for s in info.siblings or []
    ]
    return Plan(repo, revision, info.sha, files)


def marker_path(cache_dir: str, plan: Plan) -> str:
    return os.path.join(cache_dir, MARKERS, repo_folder(plan.repo), plan.commit + ".json")


def already_verified(cache_dir: str, plan: Plan, snapshot: str) -> bool:
    try:
        with open(marker_path(cache_dir, plan)) as handle:
            recorded = json.load(handle)
    except (OSError, ValueError):
        return False
    paths = [(os.path.join(snapshot, f.name), f.size) for f in plan.files]
    return recorded == {f.name: f.size for f in plan.files} and all(
        os.path.exists(path) and os.path.getsize(path) == size for path, size in paths
    )


def verify(plan: Plan, snapshot: str, progress: Progress, workers: int = 8) -> list[str]:
    """Every file present, of the Hub's size and checksum; returns what is wrong."""

    def check(f: RepoFile) -> str:
        path = os.path.join(snapshot, f.name)
        if not os.path.exists(path):
            return f"{plan.repo}/{f.name}: missing"
        size = os.path.getsize(path)
        if size != f.size:
            return f"{plan.repo}/{f.name}: {size} bytes, the Hub says {f.size}"
        if f.sha256:
            actual = sha256_of(path, progress)
            if actual != f.sha256:
                return f"{plan.repo}/{f.name}: sha256 {actual[:12]}, the Hub says {f.sha256[:12]}"
        elif f.blob_id:
            actual = git_blob_id(path, size)
            with progress.lock:
                progress.verified_bytes += size
            if actual != f.blob_id:
                return (
                    f"{plan.repo}/{f.name}: git blob {actual[:12]}, the Hub says {f.blob_id[:12]}"
                )
        return ""

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return [problem for problem in pool.map(check, plan.files) if problem]


def serve_progress(progress: Progress, port: int) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(progress.snapshot()).encode()
            self.send_response(200 if self.path.startswith("/progress") else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()


def report(payload: dict[str, Any]) -> None:
    text = json.dumps(payload, separators=(",", ":"), sort_keys=True)
    print(text, flush=True)
    try:
        with open(TERMINATION_LOG, "w") as handle:
            handle.write(text[:4000])
    except OSError:
        pass


def fill(request: dict[str, Any], progress: Progress) -> dict[str, Any]:
    from huggingface_hub import HfApi, snapshot_download

    cache_dir = os.environ["HF_HUB_CACHE"]
    verify_only = bool(request.get("verifyOnly"))
    progress.cache_dir = cache_dir
    api = HfApi()
    plans = [resolve(api, r["repo"], r["revision"]) for r in request["repos"]]
    with progress.lock:
        progress.plans = plans
        progress.bytes_total = sum(f.size for p in plans for f in p.files)
        progress.files_total = sum(len(p.files) for p in plans)
        progress.phase = "Verifying" if verify_only else "Downloading"
    snapshots = []
    for plan in plans:
        snapshot = os.path.join(cache_dir, repo_folder(plan.repo), "snapshots", plan.commit)
        if not verify_only:
            fetch_plan(plan, cache_dir)
            # Every blob is there: this only links the snapshot and writes the revision's ref.
            snapshot = snapshot_download(
                plan.repo, revision=plan.revision, cache_dir=cache_dir, max_workers=8
            )
            commit = os.path.basename(snapshot.rstrip("/"))
            if commit != plan.commit:  # the branch moved between the two calls
                plan.commit = commit
                plan.files = resolve(api, plan.repo, commit).files
        snapshots.append(snapshot)
    with progress.lock:
        progress.phase = "Verifying"
    problems: list[str] = []
    for plan, snapshot in zip(plans, snapshots, strict=True):
        if already_verified(cache_dir, plan, snapshot):
            with progress.lock:
                progress.verified_bytes += sum(f.size for f in plan.files)
            continue
        found = verify(plan, snapshot, progress)
        problems += found
        if not found and not verify_only:
            path = marker_path(cache_dir, plan)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "w") as handle:
                json.dump({f.name: f.size for f in plan.files}, handle)
    repos = [
        {
            "repo": p.repo,
            "revision": p.revision,
            "commit": p.commit,
            "files": len(p.files),
            "bytes": sum(f.size for f in p.files),
        }
        for p in plans
    ]
    if problems:
        return {"phase": "Failed", "repos": repos, "problems": problems[:10]}
    with progress.lock:
        progress.phase = "Ready"
    return {"phase": "Ready", "repos": repos, "bytesTotal": progress.bytes_total}


def main(argv: list[str]) -> int:
    request = json.loads(argv[1])
    progress = Progress()
    serve_progress(progress, int(request.get("progressPort", 8090)))
    try:
        result = fill(request, progress)
    except Exception as exc:
        result = {"phase": "Failed", "problems": [f"{type(exc).__name__}: {exc}"[:600]]}
    report(result)
    return 0 if result["phase"] == "Ready" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
