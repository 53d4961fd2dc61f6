"""HTTP errors with OpenAI's error body, and the mapping from engine errors to them.

OpenAI's body is ``{"error": {"message", "type", "param", "code"}}``; clients (the openai
package, LangChain, curl users) read ``message`` and switch on the status and ``code``.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field

from app.errors import ContextLengthError, EngineClosedError, InvalidParameterError, ModelLoadError, QwenTrayError

log = logging.getLogger("app.server")

INVALID_REQUEST = "invalid_request_error"
SERVER_ERROR = "server_error"


@dataclass(eq=False)  # eq=False keeps it hashable, as exceptions must be
class ApiError(Exception):
    """An HTTP error response: status, OpenAI error fields and extra headers."""

    status: int
    message: str
    type: str = INVALID_REQUEST
    param: str | None = None
    code: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    close_connection: bool = False  # the request body was not read: the connection cannot be reused

    def __post_init__(self) -> None:
        Exception.__init__(self, self.message)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body_bytes(self) -> bytes:
        # ASCII escapes: a message may quote client text, and that may hold a lone surrogate
        # (JSON's "\ud800"), which has no UTF-8 encoding; escaped it is still valid JSON.
        return json.dumps(self.body(), ensure_ascii=True).encode("ascii")


def invalid_param(param: str, message: str, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def context_length_exceeded(limit: int, prompt_tokens: int, prompt_param: str) -> ApiError:
    """OpenAI's message; the limit is the whole window (prompt + completion), as /health reports it."""
    return ApiError(
        400,
        f"This model's maximum context length is {limit} tokens. However, your {prompt_param} resulted in "
        f"{prompt_tokens} tokens, which leaves no room for the completion. Please reduce the length of the "
        f"{prompt_param}.",
        param=prompt_param, code="context_length_exceeded")


def max_tokens_too_large(param: str, value: int, limit: int) -> ApiError:
    digits = str(value)
    shown = digits if len(digits) <= 30 else f"{digits[:30]}... ({len(digits)} digits)"
    return invalid_param(param, f"{param} is too large: {shown}. This model supports at most {limit} completion "
                                f"tokens, whereas you provided {shown}.")


def model_not_found(model: str) -> ApiError:
    return ApiError(404, f"The model `{model}` does not exist or you do not have access to it.",
                    param="model", code="model_not_found")


def unavailable(message: str, code: str, retry_after_s: int) -> ApiError:
    return ApiError(503, message, type=SERVER_ERROR, code=code,
                    headers={"Retry-After": str(retry_after_s)})


def internal_error() -> ApiError:
    return ApiError(500, "The server had an error while processing your request (see the server log).",
                    type=SERVER_ERROR, code="internal_error")


def from_exception(exc: BaseException, *, prompt_param: str, retry_after_s: int = 1) -> ApiError:
    """Map an exception raised while serving a request to the response the client gets.

    User errors become 4xx with their one-line message; anything else is a bug, logged
    with its traceback here and answered with a 500 body that carries no traceback.
    """
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, ContextLengthError):  # the server checks first (generation.py); this is the engine's word
        return ApiError(400, f"{str(exc)[:1].upper()}{str(exc)[1:]}.", param=prompt_param,
                        code="context_length_exceeded")
    if isinstance(exc, InvalidParameterError):  # the engine's "param: what it must be"
        param = exc.param if exc.index is None else f"{exc.param}[{exc.index}]"  # stop[1], as the client sent it
        return invalid_param(param, f"Invalid value for '{param}': {exc.reason}.")
    if isinstance(exc, EngineClosedError):
        return unavailable(f"The model was unloaded while serving this request ({exc}); retry.",
                           "model_unloaded", retry_after_s)
    if isinstance(exc, ModelLoadError):  # reloading after keep-alive failed: the server's trouble, not the request's
        return unavailable(f"The model failed to load: {exc}", "model_load_failed", retry_after_s)
    if isinstance(exc, QwenTrayError):
        return ApiError(400, str(exc), code="invalid_request")
    log.error("unexpected error while serving a request", exc_info=exc)
    return internal_error()
