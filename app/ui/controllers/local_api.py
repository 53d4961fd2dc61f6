"""The seam to the local OpenAI-compatible server (``app.server``), and the key it requires.

The tray only needs: is it there, start it on a background thread for the current engine
with the key clients must send, its address, a changed key, stop it. The server package provides
``start_server_in_thread(engine_or_provider, host, port, api_key=KEY) -> handle`` with
``handle.url``, ``handle.set_api_key(KEY)`` and ``handle.stop()``; when it is missing the menu
item is disabled with the reason.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

from app import secrets
from app.errors import QwenTrayError

HOST = "127.0.0.1"  # the tray never exposes the API beyond this machine
START_FUNCTION = "start_server_in_thread"
# The variable `qwen-tray serve` reads (app.server.config.API_KEY_ENV; not imported, so that this
# seam holds without the server package). A test keeps the two names the same.
API_KEY_ENV = "QWEN_TRAY_API_KEY"
# Settings hand an edited key to the tray with the preferences they changed, under this name; it is
# not a preference (TrayApp.apply_settings keeps it in the keyring, never in settings.json).
KEY_CHANGE = "local_api_key"


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


class LocalApiKey:
    """The key the Local API requires ("" = none): $QWEN_TRAY_API_KEY when it is set, as for
    ``qwen-tray serve``; else the one Settings keep in the OS keyring (app/secrets.py).

    Never in settings.json: where no keyring exists, or it refuses the key, a key set in Settings
    is held here and protects the API until the tray quits (:meth:`keep` says why it is not saved).
    """

    def __init__(self):
        self._kept: str | None = None  # read from the keyring when first needed

    @staticmethod
    def from_environment() -> str:
        """$QWEN_TRAY_API_KEY ("" when unset or empty: then the key Settings keep applies)."""
        return os.environ.get(API_KEY_ENV, "")

    def kept(self) -> str:
        """The key Settings keep (SecretsError when the keyring cannot be read)."""
        if self._kept is None:
            self._kept = secrets.get_local_api_key()
        return self._kept

    def required(self) -> str:
        """The key clients must send; SecretsError when it cannot be known (the API must not start open)."""
        return self.from_environment() or self.kept()

    def keep(self, key: str) -> str | None:
        """Use ``key`` ("": none) from now on and keep it in the keyring; why it could not be kept
        there (it then lasts until the tray quits), or None."""
        self._kept = key
        reason = secrets.unavailable_reason()
        if reason is None:
            try:
                secrets.set_local_api_key(key)
                return None
            except secrets.SecretsError as e:
                return str(e)
        return reason if key else None  # no keyring: "no key" is what the next start has anyway


class LocalApi:
    def __init__(self, engine_provider: Callable[[], object | None],
                 finder: Callable[[], tuple[Callable | None, str]] = find_server_starter,
                 api_key: LocalApiKey | None = None):
        self._engine_provider = engine_provider
        self._start, self.unavailable_reason = finder()
        self._handle = None
        self.api_key = api_key or LocalApiKey()  # (Settings → Local API reads and changes it)
        self.requires_key = False  # whether the running server requires a key
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
        """Serve on ``port``, requiring the key :attr:`api_key` says, if any; the URL."""
        if self._start is None:
            raise LocalApiError(f"the local API is unavailable: {self.unavailable_reason}")
        if self._handle is None:
            try:
                # First: a key the keyring cannot tell (SecretsError) keeps the API stopped, not open.
                key = self.api_key.required()
                # The provider, not an engine: after a model switch the server serves the new one.
                self._handle = self._start(self._engine_provider, HOST, port, api_key=key or None)
                self.requires_key = bool(key)
            except OSError as e:
                self.last_error = f"cannot start the local API on {HOST}:{port}: {e}"
                raise LocalApiError(self.last_error) from e
            except QwenTrayError as e:  # the server's own sentence ("cannot listen on ...: Address in use")
                self.last_error = str(e)
                raise
        self.last_error = ""
        return self.url

    def change_key(self, key: str) -> str | None:
        """Settings changed the key ("": none): kept (:meth:`LocalApiKey.keep`, whose answer this is)
        and required from the running server's next request on, unless $QWEN_TRAY_API_KEY wins."""
        not_kept = self.api_key.keep(key)
        if self._handle is not None:
            required = self.api_key.required()
            self._handle.set_api_key(required or None)
            self.requires_key = bool(required)
        return not_kept

    def stop(self) -> None:
        handle, self._handle, self.requires_key = self._handle, None, False
        if handle is not None:
            handle.stop()
