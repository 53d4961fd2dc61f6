"""Server settings, validated once, shared by the CLI and the tray's in-process server."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from app.errors import QwenTrayError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 18000
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # a full 32k-token chat is ~150 KB of JSON; 4 MiB is generous
DEFAULT_MAX_QUEUED = 64  # requests allowed to wait beyond the engine's running slots
DEFAULT_SOCKET_TIMEOUT_S = 60.0  # an idle or stalled connection is dropped after this
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
    socket_timeout_s: float = DEFAULT_SOCKET_TIMEOUT_S
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
        if self.socket_timeout_s <= 0:
            raise ServerConfigError(f"socket_timeout_s must be > 0, got {self.socket_timeout_s}")
        if self.model_id is not None and not self.model_id.strip():
            raise ServerConfigError("--model-id must not be empty")
        for origin in self.cors_origins:
            if origin != "*" and "://" not in origin:
                raise ServerConfigError(
                    f"--cors-origin {origin!r} must be a full origin like http://localhost:3000 or *")

    @property
    def bind_host(self) -> str:
        """The address to bind: names are resolved to the loopback IP they mean."""
        if self.host.strip().lower().rstrip(".") in LOOPBACK_NAMES:
            return "127.0.0.1"
        ip = parse_ip(self.host)
        return str(ip) if ip is not None else self.host
