"""The HTTP server object, its admission control, and starting/stopping it on a thread.

``start_server_in_thread`` is what the tray calls and what ``qwen-tray serve`` uses:

    handle = start_server_in_thread(engine, port=18000)
    print(handle.base_url)          # http://127.0.0.1:18000/v1
    handle.stop()                   # cancels running requests, closes every connection
"""

from __future__ import annotations

import logging
import os
import socket
import socketserver
import sys
import threading
import time
from contextlib import contextmanager
from http.server import ThreadingHTTPServer
from typing import Any

from app.errors import QwenTrayError
from app.server.config import DEFAULT_HOST, DEFAULT_PORT, ServerConfig, is_loopback_host, is_wildcard_host, parse_ip
from app.server.errors import ApiError, unavailable
from app.server.handler import CONNECTION_ERRORS, ApiHandler, loading_error
from app.server.provider import EngineStatus, as_provider
from app.server.watcher import ActiveRequest, DisconnectWatcher

log = logging.getLogger("app.server")


class ServerStartError(QwenTrayError):
    """The server cannot listen (port in use, address not available)."""


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True  # a stuck client never keeps the process alive
    block_on_close = False  # stop() closes connections itself, with a timeout
    allow_reuse_address = os.name != "nt"  # on Windows SO_REUSEADDR lets a second server steal the port
    request_queue_size = 64

    def __init__(self, config: ServerConfig, provider: Any):
        self.config = config
        self.provider = provider
        self.created = int(time.time())
        self.stopping = False
        self.disconnects = 0  # generations cut short because their client left
        self._lock = threading.Condition()
        self._connections: set[socket.socket] = set()
        self._active: set[ActiveRequest] = set()
        self._admitted = 0
        ip = parse_ip(config.bind_host)
        self.address_family = socket.AF_INET6 if ip is not None and ip.version == 6 else socket.AF_INET
        self.watcher = DisconnectWatcher()
        try:
            super().__init__((config.bind_host, config.port), ApiHandler)
        except OSError as exc:
            self.watcher.close()
            raise ServerStartError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc

    def server_bind(self) -> None:
        if os.name == "nt":
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: its getfqdn() can stall on DNS
        self.server_name = self.config.host
        self.server_port = self.server_address[1]

    def handle_error(self, request, client_address) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, CONNECTION_ERRORS):
            log.debug("connection from %s dropped: %r", client_address, exc)
        else:
            log.error("error while serving %s", client_address, exc_info=exc)

    # -- engine access --------------------------------------------------------------------------
    def engine_status(self) -> EngineStatus:
        status = self.provider.status()
        if status.state == "ready" and getattr(status.engine, "closed", False):
            return EngineStatus("loading")  # the tray closed it to switch models; the next one is coming
        return status

    def ready_engine(self) -> tuple[Any, str]:
        """The engine and the model id clients must use, or a 503 while loading/stopping."""
        if self.stopping:
            raise unavailable("The server is shutting down.", "server_shutting_down", self.config.retry_after_s)
        status = self.engine_status()
        if status.state != "ready":
            raise loading_error(status.state, status.error, self.config.retry_after_s)
        return status.engine, self.config.model_id or status.engine.model_id

    def health(self) -> tuple[int, dict]:
        status = self.engine_status()
        body: dict = {"state": status.state, "model": self.config.model_id, "device": None}
        if status.state == "ready":
            engine = status.engine
            stats = engine.stats()
            body.update(model=self.config.model_id or engine.model_id, device=engine.device,
                        max_context=engine.max_context, max_batch_size=engine.max_batch_size,
                        kernels_unavailable=engine.kernels_unavailable)
            for key in ("running", "waiting", "slots"):
                if key in stats:
                    body[key] = stats[key]
            body["memory"] = {k: v for k, v in stats.items() if k.endswith("_bytes")} or None  # weights, KV cache
            if "lookup_guessed" in stats:  # tokens guessed from the requests' own text, and kept
                body["lookup"] = {"guessed": stats["lookup_guessed"], "kept": stats["lookup_kept"]}
        elif status.state == "error":
            body["error"] = status.error
        ready = status.state == "ready" and not self.stopping
        return (200 if ready else 503), body

    # -- admission and tracking -----------------------------------------------------------------
    @contextmanager
    def admission(self, engine: Any):
        """Bound the requests running or waiting in the engine; the rest get 429 at once."""
        limit = engine.max_batch_size + self.config.max_queued
        with self._lock:
            if self._admitted >= limit:
                raise ApiError(429, f"Too many requests: {self._admitted} are already running or waiting "
                                    f"(limit {limit}); retry later.", type="requests", code="rate_limit_exceeded",
                               headers={"Retry-After": str(self.config.retry_after_s)})
            self._admitted += 1
        try:
            yield
        finally:
            with self._lock:
                self._admitted -= 1

    def begin(self, active: ActiveRequest, connection: socket.socket) -> None:
        with self._lock:
            self._active.add(active)
            if self.stopping:
                active.generation.cancel()
        self.watcher.watch(connection, active.on_client_gone)

    def end(self, active: ActiveRequest, connection: socket.socket) -> None:
        self.watcher.unwatch(connection)
        with self._lock:
            self._active.discard(active)
            if active.cut_short:
                self.disconnects += 1
            self._lock.notify_all()

    def track_connection(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def untrack_connection(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)
            self._lock.notify_all()

    def stats(self) -> dict:
        with self._lock:
            return {"active": len(self._active), "admitted": self._admitted,
                    "connections": len(self._connections), "disconnects": self.disconnects}

    # -- shutdown -------------------------------------------------------------------------------
    def stop(self, timeout: float) -> None:
        """Refuse new work, cancel running generations, close every connection."""
        deadline = time.monotonic() + timeout
        with self._lock:
            self.stopping = True
            for active in self._active:
                active.generation.cancel()
        self.shutdown()  # the accept loop ends; no new connections
        with self._lock:  # running requests finish their answer ("shutting down") first
            self._lock.wait_for(lambda: not self._active, timeout=max(0.0, deadline - time.monotonic()))
            connections = list(self._connections)
        for connection in connections:  # idle keep-alive connections block in a read
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        with self._lock:
            self._lock.wait_for(lambda: not self._connections, timeout=max(0.0, deadline - time.monotonic()))
        self.server_close()
        self.watcher.close()


class ServerHandle:
    """A server running on a background thread."""

    def __init__(self, server: ApiServer, thread: threading.Thread):
        self._server = server
        self._thread = thread
        self._stopped = False
        host = server.config.bind_host
        if is_wildcard_host(host):
            host = "::1" if ":" in host else "127.0.0.1"
        self.host = host
        self.port: int = server.server_address[1]
        self.url = f"http://[{host}]:{self.port}" if ":" in host else f"http://{host}:{self.port}"
        self.base_url = self.url + "/v1"

    @property
    def config(self) -> ServerConfig:
        return self._server.config

    def stats(self) -> dict:
        return self._server.stats()

    def running(self) -> bool:
        return self._thread.is_alive() and not self._stopped

    def stop(self, timeout: float = 10.0) -> None:
        """Stop serving and free the port; safe to call twice. The engine is left running."""
        if self._stopped:
            return
        self._stopped = True
        self._server.stop(timeout)
        self._thread.join(timeout)

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
    server = ApiServer(config, as_provider(engine_or_provider))
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2},
                              name=f"qwen-tray-server-{server.server_address[1]}", daemon=True)
    thread.start()
    if not is_loopback_host(config.host):
        log.warning("the API listens on %s:%d and is reachable from other machines%s", config.host,
                    server.server_address[1], "" if config.api_key else " without an API key")
    log.info("serving on %s", server.server_address)
    return ServerHandle(server, thread)
