"""One clear sentence for everything a download can run into.

huggingface_hub raises its own types for what the hub answered (gated, repository / revision
/ file not found) and lets its HTTP client's (httpx2) errors through for the network; the
disk raises OSError. :func:`explain` turns each into a :class:`HubError` saying what happened
and what to do. What is not listed is a bug and keeps its traceback.
"""

from __future__ import annotations

import errno

import httpx2
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from app.errors import QwenTrayError
from app.progress import format_bytes

SIGN_IN = "sign in with `hf auth login` or set HF_TOKEN"


class HubError(QwenTrayError):
    """A download failed for a reason the user can act on (network, access, disk, checksum)."""


class HubUnreachableError(HubError):
    """The hub cannot be reached (offline, DNS, proxy, timeout); what was downloaded stays
    (:func:`keeping_download` says so where there is something).

    What to do about it depends on who reads it: the CLI names its options (``--source``,
    ``--endpoint``), the tray its Settings fields; so the error keeps what it is about (the
    source, whether a mirror or another endpoint was in use) and the front end words the advice
    (:meth:`advised`). Unadvised, it says only to check the network and the proxy."""

    def __init__(self, where: str, reason: str, *, source: str = "hf", custom_endpoint: bool = False,
                 kept_bytes: int = 0, advice: str = "check the network or the proxy",
                 resume: str = "the next try resumes it"):
        self.where, self.reason, self.source, self.custom_endpoint = where, reason, source, custom_endpoint
        self.kept_bytes, self.advice, self.resume = kept_bytes, advice, resume
        text = f"cannot reach {where} ({reason}); {advice}"
        if kept_bytes > 0:
            text += f"; what was downloaded ({format_bytes(kept_bytes)}) is kept and {resume}"
        super().__init__(text)

    def _with(self, **changes) -> HubUnreachableError:
        fields = {"source": self.source, "custom_endpoint": self.custom_endpoint, "kept_bytes": self.kept_bytes,
                  "advice": self.advice, "resume": self.resume}
        return HubUnreachableError(self.where, self.reason, **{**fields, **changes})

    def located(self, source: str, custom_endpoint: bool) -> HubUnreachableError:
        """The same error, knowing the source and whether a mirror / another endpoint was used."""
        return self._with(source=source, custom_endpoint=custom_endpoint)

    def advised(self, advice: str, resume: str) -> HubUnreachableError:
        """Worded for its reader: ``advice`` what to do, ``resume`` how a kept download goes on."""
        return self._with(advice=advice, resume=resume)


class HubAccessError(HubError):
    """The model is gated or private and this client is not allowed in."""


class HubNotFoundError(HubError):
    """The repository, revision or a file does not exist there."""


class DiskSpaceError(HubError):
    """Not enough free disk space for the download and the checkpoint."""


class ChecksumError(HubError):
    """A downloaded file does not match the hub's sha256 / git hash (the file is deleted)."""


class SourceFileError(HubError):
    """The source sent something other than what its listing promised (size)."""


def explain(exc: BaseException, *, where: str, repo: str, what: str | None = None) -> HubError | None:
    """The user-facing error for ``exc`` raised while fetching ``what`` (a file; None: the
    listing) of ``repo`` from ``where`` (the endpoint); None when ``exc`` is none of ours."""
    thing = f"{what} of {repo}" if what else repo
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(f"cannot download {repo}: HF_HUB_OFFLINE is set; unset it to download")
    if isinstance(exc, GatedRepoError):
        return HubAccessError(f"{repo} is gated on {where}: accept its terms on the model's page, then {SIGN_IN}")
    if isinstance(exc, RevisionNotFoundError):
        return HubNotFoundError(f"{repo} on {where} has no such revision (branch, tag or commit)")
    if isinstance(exc, RepositoryNotFoundError):
        return HubNotFoundError(f"{repo} was not found on {where} (if it is private, {SIGN_IN})")
    if isinstance(exc, EntryNotFoundError):
        return HubNotFoundError(f"{thing} was not found on {where} (HTTP 404)")
    if isinstance(exc, HfHubHTTPError):
        return http_status_error(_status(exc), where=where, thing=thing)
    if isinstance(exc, httpx2.TransportError):
        return unreachable(where, exc)
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return DiskSpaceError(f"the disk filled up while downloading {thing}; free some space and run it "
                              "again (the download resumes)")
    return None


def http_status_error(status: int | None, *, where: str, thing: str) -> HubError:
    if status in (401, 403):
        return HubAccessError(f"{where} refused access to {thing} (HTTP {status}); {SIGN_IN} if the model "
                              "needs it, or use another source")
    if status == 404:
        return HubNotFoundError(f"{thing} was not found on {where} (HTTP 404)")
    return HubError(f"{where} answered HTTP {status} for {thing}; try again later or use another source")


def unreachable(where: str, exc: BaseException, waited_s: float | None = None) -> HubUnreachableError:
    """``where`` did not answer: ``exc`` is the network's error; ``waited_s``: how long a
    metadata request waited (HF_HUB_ETAG_TIMEOUT) before it gave up."""
    reason = type(exc).__name__ + (f": {exc}" if str(exc) else "")
    if waited_s is not None and isinstance(exc, httpx2.TimeoutException):
        reason += f"; no answer within {waited_s:g} s, HF_HUB_ETAG_TIMEOUT sets how long to wait"
    return HubUnreachableError(where, reason)


def keeping_download(error: HubError, kept_bytes: int) -> HubError:
    """``error`` saying that the ``kept_bytes`` already downloaded stay for the next run, where
    there are some and the error leaves them (an unreachable hub); else ``error`` itself."""
    if kept_bytes <= 0 or not isinstance(error, HubUnreachableError):
        return error
    return error._with(kept_bytes=kept_bytes)


def _status(exc: HfHubHTTPError) -> int | None:
    response = exc.response
    return response.status_code if response is not None else None
