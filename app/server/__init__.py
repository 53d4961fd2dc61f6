"""OpenAI-compatible local HTTP API over the engine (``qwen-tray serve``, the tray's "Local API").

Names are exported lazily so the package's light modules (``app.server.cli`` and
``app.server.config``, which ``qwen-tray --help`` and ``ask --server`` read) are imported
without loading uvicorn or the engine.
"""

from __future__ import annotations

_EXPORTS = {
    "start_server_in_thread": "app.server.server",
    "start_server": "app.server.server",
    "ServerHandle": "app.server.server",
    "ServerStartError": "app.server.server",
    "ServerConfig": "app.server.config",
    "ServerConfigError": "app.server.config",
    "EngineSlot": "app.server.provider",
    "EngineStatus": "app.server.provider",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'app.server' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_EXPORTS[name]), name)
