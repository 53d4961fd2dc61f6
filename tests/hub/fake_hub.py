"""A loopback stand-in for the Hugging Face Hub and ModelScope, for the real huggingface_hub client.

It answers what huggingface_hub and app/hub call, the way the real services do:

- ``GET /api/models/{repo}/revision/{rev}?blobs=True``: model info with every sibling's size,
  git blob id and (LFS files) sha256; unknown repos get 401 + ``X-Error-Code: RepoNotFound``,
  unknown revisions 404 + ``RevisionNotFound``.
- ``GET /api/models/{repo}/tree/{rev}``: the file list ``snapshot_download`` reads.
- ``GET|HEAD /{repo}/resolve/{rev}/{path}``: small files served directly with ``ETag`` (git blob
  id) and ``X-Repo-Commit``; LFS files answered with a 302 to ``/cdn/{sha256}`` carrying
  ``X-Linked-Etag`` / ``X-Linked-Size``, as the hub redirects to its CDN. Gated repos get 401 +
  ``GatedRepo``, missing files 404 + ``EntryNotFound``. The CDN honours ``Range: bytes=N-`` (206).
- ModelScope: ``GET /api/v1/models/{repo}/repo/files`` (file list with sha256) and
  ``GET /api/v1/models/{repo}/repo?Revision=..&FilePath=..`` (the file, with ranges).
- As an HTTP proxy too: a request line with an absolute URL is served as if for this host and
  logged as proxied.

Faults a test can set per file path: ``stall_after`` (serve that many bytes, set ``stalled``,
wait for ``release``), ``drop_after`` (close the connection after that many bytes, once),
``corrupt`` (same size, other bytes), ``truncate`` (serve fewer bytes than listed).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
LFS_SUFFIXES = (".safetensors", "tokenizer.json")
CHUNK = 256 * 1024
GRANTED_TOKEN = "hf_granted"  # the one token a gated repo lets in


@dataclass
class RepoFile:
    path: str
    data: bytes

    @property
    def lfs(self) -> bool:
        return self.path.endswith(LFS_SUFFIXES)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_sha1(self) -> str:
        return hashlib.sha1(f"blob {len(self.data)}\0".encode() + self.data).hexdigest()


@dataclass
class Faults:
    stall_after: int | None = None
    drop_after: int | None = None
    corrupt: bool = False
    truncate: int | None = None  # serve only this many bytes


@dataclass
class FakeHub:
    repos: dict[str, dict[str, RepoFile]] = field(default_factory=dict)
    gated: set[str] = field(default_factory=set)
    faults: dict[str, Faults] = field(default_factory=dict)
    log: list[dict] = field(default_factory=list)  # method, path, range, proxied, sent
    stalled: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    # set when the stalled response has ended (after release: written out, or its client is gone)
    stall_ended: threading.Event = field(default_factory=threading.Event)
    served: dict[str, int] = field(default_factory=dict)  # file path -> bytes sent, all requests

    def add_repo(self, repo: str, folder: Path) -> None:
        self.repos[repo] = {p.name: RepoFile(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()}

    def find(self, sha256: str) -> RepoFile | None:
        return next((f for files in self.repos.values() for f in files.values() if f.sha256 == sha256), None)

    def start(self) -> str:
        hub = self

        class Handler(_Handler):
            state = hub

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        return self.url

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()

    def requests_for(self, path_part: str) -> list[dict]:
        return [r for r in self.log if path_part in r["path"]]


class _Handler(BaseHTTPRequestHandler):
    state: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._route(head=True)

    def do_GET(self) -> None:
        self._route(head=False)

    def _route(self, head: bool) -> None:
        proxied = self.path.startswith("http://")
        url = urlsplit(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        entry = {"method": self.command, "path": path, "range": self.headers.get("Range"), "proxied": proxied,
                 "authorization": self.headers.get("Authorization"), "sent": 0}
        self.state.log.append(entry)
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/revision/([^/]+)", path):
            return self._model_info(m[1], m[2])
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):
            return self._tree(m[1], m[2])
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m[1], m[2], m[3], head)
        if m := re.fullmatch(r"/cdn/([0-9a-f]{64})", path):
            file = self.state.find(m[1])
            return self._send_file(file, head, entry) if file else self._error(404, "EntryNotFound")
        if m := re.fullmatch(r"/api/v1/models/([^/]+/[^/]+)/repo/files", path):
            return self._modelscope_files(m[1])
        if m := re.fullmatch(r"/api/v1/models/([^/]+/[^/]+)/repo", path):
            return self._modelscope_file(m[1], query.get("FilePath", [""])[0], head, entry)
        self._error(404, None)

    # -- Hugging Face -------------------------------------------------------------------------------
    def _model_info(self, repo: str, revision: str) -> None:
        files = self.state.repos.get(repo)
        if files is None:
            return self._error(401, "RepoNotFound", "Repository not found")
        if revision not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        siblings = []
        for f in files.values():
            sibling = {"rfilename": f.path, "size": len(f.data), "blobId": f.git_sha1}
            if f.lfs:
                sibling["lfs"] = {"size": len(f.data), "sha256": f.sha256, "pointerSize": 134}
            siblings.append(sibling)
        gated = "auto" if repo in self.state.gated else False
        self._json({"_id": "x", "id": repo, "modelId": repo, "sha": COMMIT, "private": False, "gated": gated,
                    "disabled": False, "siblings": siblings, "tags": [], "downloads": 0, "likes": 0})

    def _tree(self, repo: str, revision: str) -> None:
        """The file tree (one page: no Link header), as ``snapshot_download`` lists a repo."""
        files = self.state.repos.get(repo)
        if files is None:
            return self._error(401, "RepoNotFound", "Repository not found")
        if revision not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        entries = []
        for f in files.values():
            entry = {"type": "file", "oid": f.git_sha1, "size": len(f.data), "path": f.path}
            if f.lfs:
                entry["lfs"] = {"oid": f.sha256, "size": len(f.data), "pointerSize": 134}
            entries.append(entry)
        self._json(entries)

    def _resolve(self, repo: str, revision: str, path: str, head: bool) -> None:
        files = self.state.repos.get(repo)
        if files is None:
            return self._error(401, "RepoNotFound", "Repository not found")
        authorization = self.headers.get("Authorization")
        if repo in self.state.gated and authorization != f"Bearer {GRANTED_TOKEN}":
            # 401 without a token; 403 for a user who has not been granted access (the hub's answers)
            message = f"Access to model {repo} is restricted. You must have access to it and be authenticated."
            return self._error(403 if authorization else 401, "GatedRepo", message)
        if revision not in ("main", COMMIT):
            return self._error(404, "RevisionNotFound", "Invalid rev id")
        file = files.get(path)
        if file is None:
            return self._error(404, "EntryNotFound", f"{path} does not exist on \"{revision}\"")
        common = {"X-Repo-Commit": COMMIT}
        if file.lfs:
            # Another origin (localhost, not 127.0.0.1), as the hub's CDN is another host: clients
            # read the file's metadata from this redirect and do not send the token there.
            cdn = f"http://localhost:{self.server.server_address[1]}/cdn/{file.sha256}"
            headers = {**common, "Location": cdn, "X-Linked-Etag": f'"{file.sha256}"',
                       "X-Linked-Size": str(len(file.data)), "ETag": f'"{file.git_sha1}"', "Content-Length": "0"}
            self.send_response(302)
            for k, v in headers.items():
                self.send_header(k, v)
            self.end_headers()
            return
        self._send_file(file, head, self.state.log[-1], extra={**common, "ETag": f'"{file.git_sha1}"'})

    # -- ModelScope -----------------------------------------------------------------------------------
    def _modelscope_files(self, repo: str) -> None:
        files = self.state.repos.get(repo)
        if files is None:
            return self._json({"Code": 10010205001, "Message": "model not found", "Success": False}, status=404)
        listing = [{"Name": f.path, "Path": f.path, "Revision": "master", "Sha256": f.sha256, "Size": len(f.data),
                    "Type": "blob"} for f in files.values()]
        self._json({"Code": 200, "Data": {"Files": listing}, "Message": "success", "Success": True})

    def _modelscope_file(self, repo: str, path: str, head: bool, entry: dict) -> None:
        file = self.state.repos.get(repo, {}).get(path)
        if file is None:
            return self._json({"Code": 404, "Message": "file not found", "Success": False}, status=404)
        self._send_file(file, head, entry)

    # -- bytes ------------------------------------------------------------------------------------------
    def _send_file(self, file: RepoFile, head: bool, entry: dict, extra: dict | None = None) -> None:
        faults = self.state.faults.get(file.path, Faults())
        data = file.data
        if faults.corrupt:
            data = bytes(b ^ 0xFF for b in data[:64]) + data[64:]
        if faults.truncate is not None:
            data = data[: faults.truncate]
        start = 0
        if m := re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range") or ""):
            start = int(m[1])
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        body = data[start:]
        self.send_response(206 if start else 200)
        headers = {"Content-Length": str(len(body)), "Accept-Ranges": "bytes",
                   "Content-Type": "application/octet-stream", "ETag": f'"{file.sha256}"', **(extra or {})}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self._stream(file.path, body, faults, entry)

    def _stream(self, path: str, body: bytes, faults: Faults, entry: dict) -> None:
        stalled = False
        try:
            stalled = self._stream_chunks(path, body, faults, entry)
        finally:
            if stalled:
                self.state.stall_ended.set()

    def _stream_chunks(self, path: str, body: bytes, faults: Faults, entry: dict) -> bool:
        """Send ``body``; True when this response was the one that stalled."""
        state, stalled = self.state, False
        for offset in range(0, len(body), CHUNK):
            already = state.served.get(path, 0)
            if faults.stall_after is not None and already >= faults.stall_after:
                faults.stall_after, stalled = None, True
                state.stalled.set()
                state.release.wait()
            if faults.drop_after is not None and already >= faults.drop_after:
                faults.drop_after = None
                self.close_connection = True
                return stalled
            chunk = body[offset:offset + CHUNK]
            try:
                self.wfile.write(chunk)
            except OSError:  # the client went away (killed)
                return stalled
            state.served[path] = already + len(chunk)
            entry["sent"] += len(chunk)
        return stalled

    def _json(self, data: dict | list, status: int = 200) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str = "") -> None:
        body = json.dumps({"error": message or "Not found"}).encode()
        self.send_response(status)
        if code:
            self.send_header("X-Error-Code", code)
        if message:
            self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
