"""Running the API on uvicorn, on a background thread, and stopping it.

``start_server_in_thread`` is what the tray calls and what ``qwen-tray serve`` uses:

    handle = start_server_in_thread(engine, port=18000)
    print(handle.base_url)          # http://127.0.0.1:18000/v1
    handle.stop()                   # cancels running requests, closes every connection

uvicorn (HTTP/1.1 through h11, asyncio) does the HTTP: parsing, keep-alive, limits, connection
handling, noticing clients that leave. Its event loop runs on the handle's thread, so the
caller's thread (the tray's Qt loop, ``serve``'s model loading) stays free. The socket is
bound here, before the thread starts, so a port in use is an error of the call itself.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import uvicorn

try:
    import resource  # POSIX: the open-files limit; Windows has no such per-process limit on sockets
except ImportError:
    resource = None

from app.errors import QwenTrayError
from app.server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig, is_loopback_host, is_wildcard_host, parse_ip
from app.server.h11_protocol import protocol_class
from app.server.provider import as_provider
from app.server.routes import create_app
from app.server.service import ApiService

log = logging.getLogger("app.server")

# A request head (request line + headers) larger than this gets 431: a real client's is < 2 KiB.
MAX_HEAD_BYTES = 16 * 1024
_STARTUP_TIMEOUT_S = 30.0


class ServerStartError(QwenTrayError):
    """The server cannot listen (port in use, address not available)."""


class ServerHandle:
    """A server running on a background thread."""

    def __init__(self, service: ApiService, server: uvicorn.Server, thread: threading.Thread, port: int):
        self._service = service
        self._server = server
        self._thread = thread
        self._stopped = False
        host = service.config.bind_host
        if is_wildcard_host(host):
            host = "::1" if ":" in host else "127.0.0.1"
        self.host = host
        self.port = port
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        self.base_url = self.url + "/v1"

    @property
    def config(self) -> ServerConfig:
        return self._service.config

    def set_api_key(self, api_key: str | None) -> None:
        """Require ``Authorization: Bearer API_KEY`` from the next request on (None or "": no key).

        The guard reads the key for every request, those of connections already open included,
        so a changed key applies at once without freeing the port; a stream already running
        was admitted and goes on."""
        self._service.config.api_key = api_key or None

    def stats(self) -> dict:
        """Requests running (``active``), admitted, open connections, generations cut by a disconnect."""
        stats = self._service.stats()
        return {"active": stats["active"], "admitted": stats["admitted"],
                "connections": len(self._server.server_state.connections), "disconnects": stats["disconnects"]}

    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and free the port; safe to call twice. The engine is left running.

        Running generations are cancelled first (a stream gets a "shutting down" error event, a
        waiting request a 503); uvicorn then closes the listener and idle connections and waits
        up to ``timeout`` for the rest before cancelling what is left.
        """
        if self._stopped:
            return
        self._stopped = True
        self._service.stop()
        self._server.config.timeout_graceful_shutdown = max(1, int(timeout))
        self._server.should_exit = True
        self._thread.join(timeout + 5)

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()


def start_server_in_thread(engine_or_provider: Any, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                           **options: Any) -> ServerHandle:
    """Serve ``engine_or_provider`` (Engine, EngineSlot or callable) on a daemon thread.

    ``options`` are :class:`ServerConfig` fields (model_id, api_key, cors_origins, ...);
    port 0 picks a free port (see ``handle.port``). Raises ServerStartError when the
    address cannot be bound and ServerConfigError for invalid options.
    """
    return start_server(engine_or_provider, ServerConfig(host=host, port=port, **options))


def start_server(engine_or_provider: Any, config: ServerConfig) -> ServerHandle:
    """Like :func:`start_server_in_thread`, with a ready-made config."""
    service = ApiService(config, as_provider(engine_or_provider))
    _raise_open_files_limit(config.max_connections + 256)
    sock = _listen(config)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn_config(service))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name=f"qwen-tray-server-{port}",
                              daemon=True)
    thread.start()
    deadline = time.monotonic() + _STARTUP_TIMEOUT_S
    while not server.started:  # uvicorn has no start callback; startup takes milliseconds
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            sock.close()
            raise ServerStartError(f"the HTTP server on {config.host}:{port} did not start (see the log)")
        time.sleep(0.005)
    if not is_loopback_host(config.host):
        log.warning("the API listens on %s:%d and is reachable from other machines%s", config.host, port,
                    "" if config.api_key else " without an API key")
    log.info("serving on %s:%d", config.bind_host, port)
    return ServerHandle(service, server, thread, port)


def uvicorn_config(service: ApiService) -> uvicorn.Config:
    """uvicorn's settings for this API (docs/SERVER.md, "HTTP stack and limits")."""
    config = service.config
    return uvicorn.Config(
        create_app(service),
        http=protocol_class(config.request_timeout_s),  # h11 + the request-head deadline
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        loop="asyncio",  # the standard loop everywhere (the Proactor on Windows: no 512-socket select limit)
        ws="none", lifespan="off", interface="asgi3",
        timeout_keep_alive=config.keep_alive_s,
        limit_concurrency=config.max_connections,
        backlog=config.backlog,
        proxy_headers=False,  # no proxy in front of a local server: X-Forwarded-* are a client's words
        server_header=False, date_header=True,
        log_config=None,  # the application (tray, CLI) configures logging, not uvicorn
        access_log=True,  # "uvicorn.access" at INFO, through the application's handlers
    )


def _listen(config: ServerConfig) -> socket.socket:
    ip = parse_ip(config.bind_host)
    family = socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name == "nt":  # SO_REUSEADDR on Windows would let a second server steal the port
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
        else:  # a restart right after stop() must not wait for TIME_WAIT connections
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((config.bind_host, config.port))
        sock.listen(config.backlog)
    except OSError as exc:
        sock.close()
        raise ServerStartError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc
    return sock


def _raise_open_files_limit(wanted: int) -> None:
    """Let the process hold ``wanted`` sockets: Linux desktops start with a soft limit of 1,024
    open files, below the connections the server accepts (vLLM and SGLang raise it too)."""
    if resource is None:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.debug("cannot raise the open-files limit to %d: %s", target, exc)
