"""One OpenAI-compatible endpoint (base URL, API key, proxy, timeouts) through the openai SDK."""

from __future__ import annotations

import time
import urllib.parse
from dataclasses import dataclass

import openai

from app.engine.params import SamplingParams
from app.remote.errors import RemoteConnectionError, RemoteError, server_message
from app.remote.stream import Message, RemoteStream, estimate_chat_tokens, request_arguments

CONNECT_TIMEOUT_S = 10.0
DIRECT = "direct"  # the proxy choice "no proxy, whatever the system says" (the tray's network_proxy preference)


@dataclass(frozen=True, slots=True)
class FixHints:
    """What the user can change after a refusal, in the caller's own terms (the tray names its
    Settings page, the CLI its options); appended to the sentence when not empty."""

    api_key: str = ""  # after a 401
    model: str = ""  # after a 404 for the model asked for


class RemoteClient:
    """Chat completions and the model list of one endpoint. ``api_key`` "" sends no
    Authorization header; ``proxy`` "" is the system's proxy, ``DIRECT`` none, else a proxy URL."""

    def __init__(self, base_url: str, api_key: str = "", *, timeout_s: float = 120.0, proxy: str = "",
                 hints: FixHints = FixHints()):
        if not is_http_url(base_url):
            raise RemoteError(f"remote base URL {base_url!r} must look like https://host/v1")
        self.base_url = base_url.rstrip("/")
        self.proxy = proxy
        self.timeout_s = timeout_s
        self._hints = hints
        # No key: the header is left out (a local server without keys), not sent empty.
        self._auth = {} if api_key else {"extra_headers": {"Authorization": openai.Omit()}}
        timeout = openai.Timeout(timeout_s, connect=CONNECT_TIMEOUT_S)
        self._client = openai.OpenAI(base_url=self.base_url, api_key=api_key or "none", max_retries=0,
                                     timeout=timeout, http_client=_http_client(proxy, timeout))

    def chat(self, model: str, messages: list[Message], params: SamplingParams) -> RemoteStream:
        """Start streaming the answer; a refusal (401, 404, 400, ...) is raised here, as a RemoteError."""
        started = time.perf_counter()
        try:
            stream = self._client.chat.completions.create(**request_arguments(model, messages, params), **self._auth)
        except openai.APIError as e:
            raise self._explain(e, model) from None
        return RemoteStream(stream, lambda e: self._explain(e, model, streaming=True),
                            estimate_chat_tokens(messages), started)

    def first_model(self) -> str:
        """The id of the first model the endpoint lists (GET /models)."""
        try:
            models = self._client.models.list(**self._auth).data
        except (openai.APIError, ValueError) as e:
            raise self._explain(e) from None
        if not models:
            raise RemoteError(f"{self.base_url} lists no models", status=200)
        return models[0].id

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> RemoteClient:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def _explain(self, error: Exception, model: str | None = None, streaming: bool = False) -> RemoteError:
        """One sentence per failure: unreachable, too slow, connection lost, or the endpoint's refusal."""
        where = self.base_url + (f" through the proxy {self.proxy}" if self.proxy not in ("", DIRECT) else "")
        if isinstance(error, openai.APITimeoutError):
            return RemoteConnectionError(f"{where} did not answer within {self.timeout_s:g} s")
        if isinstance(error, openai.APIConnectionError):
            cause = error.__cause__ or error.__context__
            verb = "lost the connection to" if streaming else "cannot reach"
            return RemoteConnectionError(f"{verb} {where}" + (f": {cause}" if cause and str(cause) else ""))
        if isinstance(error, openai.APIError):
            return self._refusal(error, model)
        return RemoteError(f"{self.base_url} sent what is not the API's JSON ({error})")

    def _refusal(self, error: openai.APIError, model: str | None) -> RemoteError:
        """The endpoint's own error (its message kept): key refused, no such model, rate-limited, other."""
        message = server_message(error)
        status = error.status_code if isinstance(error, openai.APIStatusError) else None
        if isinstance(error, openai.AuthenticationError):
            text = f"{self.base_url} refused the API key (HTTP 401: {message})" + _then(self._hints.api_key)
        elif isinstance(error, openai.NotFoundError) and model is not None:
            text = f"{self.base_url} has no model {model!r} (HTTP 404: {message})" + _then(self._hints.model)
        elif isinstance(error, openai.RateLimitError):
            wait = error.response.headers.get("retry-after")
            text = (f"{self.base_url} is rate-limiting requests (HTTP 429: {message})"
                    + (f"; try again in {wait} s" if wait else "; try again later"))
        elif status is not None:
            text = f"{self.base_url}: HTTP {status}: {message}"
        else:  # an error event in the middle of a stream
            text = f"{self.base_url} sent an error: {message}"
        return RemoteError(text, status=status, code=error.code)


def is_http_url(text: str) -> bool:
    """An http(s) URL with a host, and a port that is a number when there is one."""
    try:
        url = urllib.parse.urlsplit(text)
        url.port  # noqa: B018 - a port that is no number raises here, not later inside the SDK
    except ValueError:  # that, or an unclosed [ of an IPv6 address
        return False
    return url.scheme in ("http", "https") and bool(url.hostname)


def _then(hint: str) -> str:
    return f"; {hint}" if hint else ""


def _http_client(proxy: str, timeout: openai.Timeout) -> openai.DefaultHttpxClient:
    """The SDK's HTTP client (its defaults) with the proxy asked for."""
    if proxy == DIRECT:
        return openai.DefaultHttpxClient(timeout=timeout, trust_env=False)
    if proxy:
        return openai.DefaultHttpxClient(timeout=timeout, proxy=proxy)
    return openai.DefaultHttpxClient(timeout=timeout)  # the system's proxy settings
