"""Where answers come from: the local engine or a remote OpenAI-compatible endpoint."""

from app.ui.backend.base import ChatBackend, ChatStream

__all__ = ["ChatBackend", "ChatStream"]
