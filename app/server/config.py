"""Server settings, validated once, shared by the CLI and the tray's in-process server."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from app.errors import QwenTrayError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18000
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a full 32k-token chat is ~150 KB of JSON; 4 MiB is generous
DEFAULT_MAX_QUEUED = 64  # requests allowed to wait beyond the engine's running slots
# A connection must deliver a request's head (request line + headers) within this many seconds of
# opening or of the previous response, and then its body within as many again; else it is closed.
# uvicorn has no such deadline of its own: without it a client trickling bytes holds a socket forever.
DEFAULT_REQUEST_TIMEOUT_S = 30.0
# An idle keep-alive connection is closed after this; longer than the openai SDK's (httpx) 5 s pool
# expiry, so a pooled client connection retires on the client's side before the server closes it.
DEFAULT_KEEP_ALIVE_S = 15.0
# Open connections (idle ones included) above which uvicorn answers new requests with a plain 503.
# Generation work is bounded far below this by admission (429); this bounds sockets and memory.
DEFAULT_MAX_CONNECTIONS = 8192
DEFAULT_BACKLOG = 2048  # connections the kernel queues before accept (Linux caps it at somaxconn)
API_KEY_ENV = "QWEN_TRAY_API_KEY"

# Names that always mean "this machine" and that a DNS-rebinding page cannot claim.
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


class ServerConfigError(QwenTrayError):
    """A server option is invalid (names the option)."""


def parse_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The IP address a host string spells, or None for a name ('[::1]' brackets allowed)."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone id
    except ValueError:
        return None


def is_loopback_host(host: str) -> bool:
    """True for 'localhost'-style names and loopback IPs (127.0.0.0/8, ::1)."""
    name = host.strip().lower().rstrip(".")
    if name in LOOPBACK_NAMES:
        return True
    ip = parse_ip(name)
    return ip is not None and ip.is_loopback


def cors_origin_problem(origin: str) -> str | None:
    """Why ``--cors-origin`` cannot take ``origin``, as the end of a sentence; None when it can."""
    if origin.lower() == "null":  # opaque: not one page's origin but every sandboxed one's
        return ("cannot be allowed: any web site can send it from a sandboxed frame (file:// pages send it too); "
                "serve the page from an http:// origin and allow that origin")
    if origin != "*" and "://" not in origin:
        return "must be a full origin like http://localhost:3000 or *"
    return None


def is_wildcard_host(host: str) -> bool:
    ip = parse_ip(host)
    return ip is not None and ip.is_unspecified


@dataclass(slots=True)
class ServerConfig:
    """Everything the HTTP layer needs besides the engine.

    ``host`` must be a loopback address unless ``allow_remote`` is set: a local server is
    reachable by every web page the user opens, so exposing it is an explicit decision.
    """

    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    model_id: str | None = None  # the id clients send; default: the engine's model_id
    api_key: str | None = None  # None/"" = no authentication
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call us ("*" = any)
    allowed_hosts: tuple[str, ...] = ()  # extra Host header names accepted (e.g. a LAN name)
    allow_remote: bool = False
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_queued: int = DEFAULT_MAX_QUEUED
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S
    keep_alive_s: float = DEFAULT_KEEP_ALIVE_S
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    backlog: int = DEFAULT_BACKLOG
    retry_after_s: int = 1  # what a 429/503 tells clients to wait

    def __post_init__(self) -> None:
        self.cors_origins = tuple(o.rstrip("/") for o in self.cors_origins)
        self.allowed_hosts = tuple(h.strip().lower() for h in self.allowed_hosts)
        self.api_key = self.api_key or None
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ServerConfigError(f"--port must be 0..65535, got {self.port!r}")
        if not self.host:
            raise ServerConfigError("--host must not be empty")
        if not is_loopback_host(self.host) and not self.allow_remote:
            raise ServerConfigError(
                f"--host {self.host} is not a loopback address; add --allow-remote to expose "
                "the server to other machines")
        if self.max_body_bytes < 1024:
            raise ServerConfigError(f"max_body_bytes must be >= 1024, got {self.max_body_bytes}")
        if self.max_queued < 0:
            raise ServerConfigError(f"--max-queued must be >= 0, got {self.max_queued}")
        for name, seconds in (("request_timeout_s", self.request_timeout_s), ("keep_alive_s", self.keep_alive_s)):
            if not seconds > 0:
                raise ServerConfigError(f"{name} must be > 0, got {seconds!r}")
        for name, count in (("max_connections", self.max_connections), ("backlog", self.backlog)):
            if count < 1:
                raise ServerConfigError(f"{name} must be >= 1, got {count!r}")
        if self.model_id is not None and not self.model_id.strip():
            raise ServerConfigError("--model-id must not be empty")
        for origin in self.cors_origins:
            problem = cors_origin_problem(origin)
            if problem is not None:
                raise ServerConfigError(f"--cors-origin {origin!r} {problem}")

    @property
    def bind_host(self) -> str:
        """The address to bind: names are resolved to the loopback IP they mean."""
        if self.host.strip().lower().rstrip(".") in LOOPBACK_NAMES:
            return "127.0.0.1"
        ip = parse_ip(self.host)
        return str(ip) if ip is not None else self.host
