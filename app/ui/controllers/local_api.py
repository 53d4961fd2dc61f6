"""The seam to the local OpenAI-compatible server (``app.server``).

The tray only needs: is it there, start it on a background thread for the current engine,
its address, stop it. The server package provides
``start_server_in_thread(engine_or_provider, host, port) -> handle`` with ``handle.url``
and ``handle.stop()``; when it is missing the menu item is disabled with the reason.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from app.errors import QwenTrayError

HOST = "127.0.0.1"  # the tray never exposes the API beyond this machine
START_FUNCTION = "start_server_in_thread"


class LocalApiError(QwenTrayError):
    """The local API could not be started."""


def find_server_starter() -> tuple[Callable | None, str]:
    """(start function, "") or (None, why it is unavailable)."""
    try:
        server = importlib.import_module("app.server")
    except ImportError as e:
        return None, f"app.server cannot be imported ({e})"
    start = getattr(server, START_FUNCTION, None)
    if start is None:
        return None, f"app.server has no {START_FUNCTION}()"
    return start, ""


class LocalApi:
    def __init__(self, engine_provider: Callable[[], object | None],
                 finder: Callable[[], tuple[Callable | None, str]] = find_server_starter):
        self._engine_provider = engine_provider
        self._start, self.unavailable_reason = finder()
        self._handle = None
        self.last_error = ""  # why the last start failed (the menu shows it while not running)

    @property
    def available(self) -> bool:
        return self._start is not None

    @property
    def running(self) -> bool:
        return self._handle is not None

    @property
    def url(self) -> str:
        """The OpenAI base URL clients use (``.../v1``)."""
        if self._handle is None:
            return ""
        return str(getattr(self._handle, "base_url", None) or self._handle.url)

    def start(self, port: int) -> str:
        if self._start is None:
            raise LocalApiError(f"the local API is unavailable: {self.unavailable_reason}")
        if self._handle is None:
            try:
                # The provider, not an engine: after a model switch the server serves the new one.
                self._handle = self._start(self._engine_provider, HOST, port)
            except OSError as e:
                self.last_error = f"cannot start the local API on {HOST}:{port}: {e}"
                raise LocalApiError(self.last_error) from e
            except QwenTrayError as e:  # the server's own sentence ("cannot listen on ...: Address in use")
                self.last_error = str(e)
                raise
        self.last_error = ""
        return self.url

    def stop(self) -> None:
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.stop()
