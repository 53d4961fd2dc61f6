"""The remote client's errors: one sentence each, for the tray's popup and the CLI's stderr line."""

from __future__ import annotations

import openai

from app.errors import QwenTrayError

MESSAGE_LIMIT = 400  # an endpoint may answer an error with a whole HTML page


class RemoteError(QwenTrayError):
    """The endpoint answered with an error, or sent what is not the API's; ``status`` is the
    HTTP status (None without one) and ``code`` the API's error code (``invalid_api_key``,
    ``context_length_exceeded``, ...) when the endpoint gave one."""

    def __init__(self, message: str, *, status: int | None = None, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class RemoteConnectionError(RemoteError):
    """The endpoint could not be reached, did not answer in time, or the connection broke."""


def server_message(error: openai.APIError) -> str:
    """The server's own error message (OpenAI's shape: {"error": {"message": ...}}) on one line."""
    body = error.body
    text = None
    if isinstance(body, dict):
        inner = body.get("error", body)
        text = inner.get("message") if isinstance(inner, dict) else inner
    text = " ".join(str(text or error.message or "no error message").split())
    return text if len(text) <= MESSAGE_LIMIT else text[:MESSAGE_LIMIT - 1] + "…"
