"""Where model files come from: the Hugging Face Hub (or a mirror of it) and ModelScope.

A source turns a repository reference into a :class:`Snapshot`: the files to fetch, each with
its URL, size and checksum, at one fixed commit. Both are read with huggingface_hub's client:
``HfApi.model_info`` for the hub, and its HTTP session for ModelScope's public JSON API
(``/api/v1/models/{repo}/repo/files``), which lists every file's sha256. docs/ARCHITECTURE.md
says why ModelScope is read this way rather than through its SDK.
"""

from __future__ import annotations

import fnmatch
import os
from dataclasses import dataclass, field
from urllib.parse import quote

import httpx2
from huggingface_hub import HfApi, constants, hf_hub_url
from huggingface_hub.utils import build_hf_headers, get_session

from app.hub.catalog import REQUIRED_FILES, RepoRef
from app.hub.errors import HubError, HubNotFoundError, explain, http_status_error, unreachable

MODELSCOPE_ENDPOINT = "https://www.modelscope.cn"
HF_ENDPOINT = "https://huggingface.co"  # the official hub (HF_ENDPOINT / --endpoint name a mirror)
MODELSCOPE_ENDPOINT_ENV = "MODELSCOPE_ENDPOINT"  # the variable ModelScope's own SDK reads
METADATA_TIMEOUT_ENV = "HF_HUB_ETAG_TIMEOUT"  # huggingface_hub's seconds to wait for a metadata answer


def metadata_timeout() -> float:
    """Seconds a listing may wait for the server's answer: HF_HUB_ETAG_TIMEOUT as huggingface_hub
    reads it (default 10), read at each call so that setting it applies to the next listing."""
    value = os.environ.get(METADATA_TIMEOUT_ENV, "")
    try:
        seconds = float(value) if value.strip() else float(constants.DEFAULT_ETAG_TIMEOUT)
    except ValueError:
        raise HubError(f"{METADATA_TIMEOUT_ENV} must be a number of seconds, got {value!r}") from None
    if seconds <= 0:
        raise HubError(f"{METADATA_TIMEOUT_ENV} must be a number of seconds above 0, got {value!r}")
    return seconds


@dataclass(frozen=True)
class RemoteFile:
    path: str  # relative to the repository root
    size: int
    url: str
    sha256: str | None = None  # the hub's LFS sha256; ModelScope gives it for every file
    git_sha1: str | None = None  # the hub's git blob id of a small (non-LFS) file

    @property
    def identity(self) -> str:
        """What the file must be: its checksum (or at least its size)."""
        if self.sha256:
            return f"sha256:{self.sha256}"
        if self.git_sha1:
            return f"git-sha1:{self.git_sha1}"
        return f"size:{self.size}"


@dataclass(frozen=True)
class Snapshot:
    source: str  # "hf" / "modelscope"
    endpoint: str
    repo: str
    revision: str  # the commit the listing resolved to (or the branch, where the source gives none)
    files: tuple[RemoteFile, ...]
    headers: dict[str, str] = field(default_factory=dict, compare=False)  # authorization, user agent

    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


def select_files(paths: list[str], patterns: tuple[str, ...], *, repo: str, where: str) -> set[str]:
    """The repository's files matching ``patterns``; every file the app needs must be there."""
    chosen = {p for p in paths if any(fnmatch.fnmatchcase(p, pattern) for pattern in patterns)}
    missing = [f for f in REQUIRED_FILES if f not in chosen]
    if not any(p.endswith(".safetensors") for p in chosen):
        missing.append("*.safetensors")
    if missing:
        raise HubNotFoundError(f"{repo} on {where} has no {', '.join(missing)}: not a Qwen2/Llama model folder "
                               "the app can use")
    return chosen


class HuggingFace:
    """The Hugging Face Hub, or a mirror with its API (``endpoint``; default: HF_ENDPOINT or
    huggingface.co). The token is huggingface_hub's own: HF_TOKEN or `hf auth login`."""

    name = "hf"

    def __init__(self, endpoint: str | None = None):
        self.endpoint = (endpoint or constants.ENDPOINT).rstrip("/")

    @property
    def custom_endpoint(self) -> bool:
        """A mirror (--endpoint, Settings, HF_ENDPOINT) rather than the official hub."""
        return self.endpoint != HF_ENDPOINT

    def snapshot(self, ref: RepoRef, patterns: tuple[str, ...]) -> Snapshot:
        timeout = metadata_timeout()
        try:
            info = HfApi(endpoint=self.endpoint).model_info(ref.repo, revision=ref.revision, files_metadata=True,
                                                            timeout=timeout)
        except httpx2.TransportError as e:
            raise unreachable(self.endpoint, e, timeout) from None
        except Exception as e:
            raise (explain(e, where=self.endpoint, repo=ref.repo) or e) from None
        siblings = {s.rfilename: s for s in info.siblings or []}
        chosen = select_files(list(siblings), patterns, repo=ref.repo, where=self.endpoint)
        commit = info.sha or ref.revision
        files = tuple(
            RemoteFile(path=s.rfilename, size=_size(s), sha256=s.lfs.sha256 if s.lfs else None,
                       git_sha1=None if s.lfs else s.blob_id,
                       url=hf_hub_url(ref.repo, s.rfilename, revision=commit, endpoint=self.endpoint))
            for name, s in sorted(siblings.items()) if name in chosen)
        return Snapshot(self.name, self.endpoint, ref.repo, commit, files, build_hf_headers())


def _size(sibling) -> int:
    size = sibling.lfs.size if sibling.lfs else sibling.size
    if size is None:
        raise HubError(f"the hub listed {sibling.rfilename} without its size; try again later")
    return int(size)


class ModelScope:
    """ModelScope's public API (``endpoint``; default: MODELSCOPE_ENDPOINT or www.modelscope.cn)."""

    name = "modelscope"

    def __init__(self, endpoint: str | None = None):
        self.endpoint = (endpoint or os.environ.get(MODELSCOPE_ENDPOINT_ENV) or MODELSCOPE_ENDPOINT).rstrip("/")

    @property
    def custom_endpoint(self) -> bool:
        """Another endpoint (--endpoint, MODELSCOPE_ENDPOINT) rather than www.modelscope.cn."""
        return self.endpoint != MODELSCOPE_ENDPOINT

    def snapshot(self, ref: RepoRef, patterns: tuple[str, ...]) -> Snapshot:
        listing = self._list_files(ref)
        blobs = {f["Path"]: f for f in listing if f.get("Type", "blob") == "blob" and "Path" in f}
        chosen = select_files(list(blobs), patterns, repo=ref.repo, where=self.endpoint)
        files = tuple(RemoteFile(path=p, size=int(blobs[p].get("Size", 0)), sha256=blobs[p].get("Sha256") or None,
                                 url=self._file_url(ref, p))
                      for p in sorted(chosen))
        return Snapshot(self.name, self.endpoint, ref.repo, ref.revision, files)

    def _list_files(self, ref: RepoRef) -> list[dict]:
        url = f"{self.endpoint}/api/v1/models/{ref.repo}/repo/files"
        timeout = metadata_timeout()
        try:
            response = get_session().get(url, params={"Revision": ref.revision, "Recursive": "True"},
                                         timeout=timeout)
        except httpx2.TransportError as e:
            raise unreachable(self.endpoint, e, timeout) from None
        except Exception as e:
            raise (explain(e, where=self.endpoint, repo=ref.repo) or e) from None
        body = _json(response)
        if response.status_code == 404 or (body.get("Code") == 404):
            raise HubNotFoundError(f"{ref.repo} (revision {ref.revision}) was not found on {self.endpoint}")
        if response.status_code >= 400:
            raise http_status_error(response.status_code, where=self.endpoint, thing=ref.repo)
        data = body.get("Data")
        if body.get("Success") is False or not isinstance(data, dict) or not isinstance(data.get("Files"), list):
            message = body.get("Message") or "no file list in its answer"
            raise HubError(f"{self.endpoint} could not list {ref.repo} ({message}); try again later or use "
                           "another source")
        return data["Files"]

    def _file_url(self, ref: RepoRef, path: str) -> str:
        return (f"{self.endpoint}/api/v1/models/{ref.repo}/repo?Revision={quote(ref.revision, safe='')}"
                f"&FilePath={quote(path, safe='')}")


def _json(response) -> dict:
    try:
        body = response.json()
    except ValueError:
        return {}
    return body if isinstance(body, dict) else {}


def make_source(name: str, endpoint: str | None = None) -> HuggingFace | ModelScope:
    if name == "hf":
        return HuggingFace(endpoint)
    if name == "modelscope":
        return ModelScope(endpoint)
    raise HubError(f"source must be hf or modelscope, got {name!r}")
