"""A remote OpenAI-compatible endpoint behind the tray's backend protocol.

The client itself (the openai SDK, the proxy, timeouts, one sentence per failure) is
app/remote/, shared with ``qwen-tray ask --server``; this module adds what only the tray has:
the model of a registry entry, its context, the idle unload and VRAM the protocol asks about,
and refusals that point at Settings → Models.
"""

from __future__ import annotations

from collections.abc import Callable

from app.engine.params import SamplingParams
from app.remote import FixHints, Message, RemoteClient, RemoteStream, estimate_chat_tokens, estimate_tokens

SETTINGS_HINTS = FixHints(api_key="check the key in Settings → Models",
                          model="check the model id and the base URL in Settings → Models")


class RemoteBackend:
    device = "remote"
    kernels_unavailable = None  # the server's own affair

    def __init__(self, base_url: str, model: str, api_key: str = "", max_context: int = 32768,
                 name: str | None = None, timeout_s: float = 120.0, proxy: str = ""):
        self._client = RemoteClient(base_url, api_key, timeout_s=timeout_s, proxy=proxy, hints=SETTINGS_HINTS)
        self.base_url = self._client.base_url
        self.model = model
        self.max_context = max_context
        self.name = name or model
        self.proxy = proxy  # the network_proxy preference: "" the system's, "direct" none, else this proxy URL

    def chat(self, messages: list[Message], params: SamplingParams, priority: int) -> RemoteStream:
        del priority  # a remote endpoint has its own scheduling
        return self._client.chat(self.model, messages, params)

    def count_tokens(self, text: str) -> int:
        return estimate_tokens(text)

    def count_chat_tokens(self, messages: list[Message]) -> int:
        return estimate_chat_tokens(messages)

    def set_idle_unload(self, seconds: float | None, on_state: Callable[[str], None]) -> None:
        """Nothing to unload: the model runs on the server."""

    def vram_bytes(self) -> int | None:
        return None  # the remote server's memory is not ours to report

    def close(self) -> None:
        self._client.close()
