"""A small Hugging Face Hub for the download tests: the routes huggingface_hub uses to list a
repository (model info with file sizes and checksums, the file tree) and to fetch a file
(HEAD for its metadata, GET with Range to resume), served from repositories the tests make in
memory. It can be throttled so a test can kill a download midway, and it records every range
it served, so a test can see a resumed download. Nothing here comes from the real Hub."""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote, urlparse

CHUNK = 64 * 1024


@dataclass(frozen=True)
class HubFile:
    name: str
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def blob_id(self) -> str:
        header = f"blob {len(self.data)}\0".encode()
        return hashlib.sha1(header + self.data).hexdigest()

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class HubRepo:
    repo: str
    commit: str
    files: dict[str, HubFile]


@dataclass
class FakeHub:
    host: str = "127.0.0.1"
    port: int = 0
    bytes_per_second: float = 0.0  # 0: as fast as it goes
    repos: dict[str, HubRepo] = field(default_factory=dict)
    served: list[tuple[str, int, int]] = field(default_factory=list)  # (file, start, bytes)
    requested: list[str] = field(default_factory=list)  # every path asked for
    lock: threading.Lock = field(default_factory=threading.Lock)
    _server: http.server.ThreadingHTTPServer | None = None

    def add_repo(self, repo: str, files: dict[str, bytes], lfs_suffix: str = ".safetensors") -> str:
        commit = hashlib.sha1(repo.encode() + b"".join(sorted(files.values()))).hexdigest()
        self.repos[repo] = HubRepo(
            repo,
            commit,
            {name: HubFile(name, data, name.endswith(lfs_suffix)) for name, data in files.items()},
        )
        return commit

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def ranges(self, name: str) -> list[tuple[int, int]]:
        with self.lock:
            return [(start, size) for file, start, size in self.served if file == name]

    def start(self) -> FakeHub:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                hub.handle(self, body=False)

            def do_GET(self) -> None:
                hub.handle(self, body=True)

        self._server = http.server.ThreadingHTTPServer((self.host, self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # --- routes ---------------------------------------------------------------------------

    def _repo(self, name: str, revision: str) -> HubRepo | None:
        repo = self.repos.get(name)
        if repo is None or revision not in ("main", repo.commit):
            return None
        return repo

    def handle(self, request: http.server.BaseHTTPRequestHandler, body: bool) -> None:
        path = unquote(urlparse(request.path).path)
        with self.lock:
            self.requested.append(path)
        info = re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path)
        tree = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path)
        resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if info and (repo := self._repo(info.group(1), info.group(2))):
            self._json(request, self._model_info(repo), body)
        elif tree and (repo := self._repo(tree.group(1), tree.group(2))):
            self._json(request, self._tree(repo), body)
        elif resolve and (repo := self._repo(resolve.group(1), resolve.group(2))):
            hub_file = repo.files.get(resolve.group(3))
            if hub_file is None:
                self._error(request, 404, "EntryNotFound")
            else:
                self._file(request, repo, hub_file, body)
        else:
            self._error(request, 404, "RepositoryNotFound")

    @staticmethod
    def _model_info(repo: HubRepo) -> dict[str, Any]:
        return {
            "id": repo.repo,
            "modelId": repo.repo,
            "sha": repo.commit,
            "siblings": [
                {
                    "rfilename": f.name,
                    "size": len(f.data),
                    "blobId": f.blob_id,
                    **(
                        {"lfs": {"size": len(f.data), "sha256": f.sha256, "pointerSize": 134}}
                        if f.lfs
                        else {}
                    ),
                }
                for f in repo.files.values()
            ],
        }

    @staticmethod
    def _tree(repo: HubRepo) -> list[dict[str, Any]]:
        return [
            {
                "type": "file",
                "path": f.name,
                "size": len(f.data),
                "oid": f.blob_id,
                **(
                    {"lfs": {"size": len(f.data), "oid": f.sha256, "pointerSize": 134}}
                    if f.lfs
                    else {}
                ),
            }
            for f in repo.files.values()
        ]

    @staticmethod
    def _json(request: http.server.BaseHTTPRequestHandler, payload: Any, body: bool) -> None:
        data = json.dumps(payload).encode()
        request.send_response(200)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if body:
            request.wfile.write(data)

    @staticmethod
    def _error(request: http.server.BaseHTTPRequestHandler, status: int, code: str) -> None:
        data = json.dumps({"error": code}).encode()
        request.send_response(status)
        request.send_header("X-Error-Code", code)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def _file(
        self, request: http.server.BaseHTTPRequestHandler, repo: HubRepo, f: HubFile, body: bool
    ) -> None:
        start = 0
        wanted = re.fullmatch(r"bytes=(\d+)-", request.headers.get("Range") or "")
        if wanted:
            start = min(int(wanted.group(1)), len(f.data))
        data = f.data[start:]
        request.send_response(206 if wanted else 200)
        request.send_header("X-Repo-Commit", repo.commit)
        request.send_header("ETag", f'"{f.etag}"')
        if f.lfs:
            request.send_header("X-Linked-Etag", f'"{f.etag}"')
            request.send_header("X-Linked-Size", str(len(f.data)))
        request.send_header("Accept-Ranges", "bytes")
        if wanted:
            request.send_header("Content-Range", f"bytes {start}-{len(f.data) - 1}/{len(f.data)}")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        if not body:
            return
        sent = 0
        try:
            for offset in range(0, len(data), CHUNK):
                piece = data[offset : offset + CHUNK]
                request.wfile.write(piece)
                sent += len(piece)
                if self.bytes_per_second:
                    time.sleep(len(piece) / self.bytes_per_second)
        except (BrokenPipeError, ConnectionResetError):
            pass
        finally:
            with self.lock:
                self.served.append((f.name, start, sent))
