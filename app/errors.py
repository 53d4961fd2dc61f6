"""User-facing errors.

Every error a user can cause (a wrong path, a broken file, a prompt past the context) is a
:class:`QwenTrayError`. The CLI prints its message on one line and exits non-zero; the server
maps it to an OpenAI error body; the tray shows it in a notification. Anything else is a bug
and keeps its traceback.
"""

from __future__ import annotations


def pip_install_extra(extras: str) -> str:
    """How to add an optional part (an extra) of Qwen Tray: from its checkout, as it is not on PyPI."""
    return f'in the qwen-tray folder: pip install -e ".[{extras}]"'


# CuPy and NVRTC for the CUDA major version PyTorch was built with.
CUPY_HINT = f'{pip_install_extra("cuda12")}; ".[cuda13]" with a CUDA 13 build of PyTorch'


class QwenTrayError(Exception):
    """An error caused by input or environment, explained in one line."""


class ModelLoadError(QwenTrayError):
    """A model folder, checkpoint or adapter cannot be loaded (names the file)."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture or a config field is not supported (names the supported ones)."""


class ContextLengthError(QwenTrayError):
    """A prompt (plus the requested completion) does not fit the context window."""

    def __init__(self, message: str, *, limit: int, requested: int):
        super().__init__(message)
        self.limit = limit
        self.requested = requested


class InvalidParameterError(QwenTrayError):
    """A parameter is out of range: ``param`` as the engine's API spells it (``top_p``), ``reason``
    why. The message is "param: reason"; the CLI names its option instead (``--top-p``). ``index``
    is the element of a list parameter that is wrong (``stop`` 1: the second stop string), else None."""

    def __init__(self, param: str, reason: str, index: int | None = None):
        super().__init__(f"{param}: {reason}")
        self.param = param
        self.reason = reason
        self.index = index


class EngineClosedError(QwenTrayError):
    """The engine was shut down (model switch, quit) while a request was waiting or running."""


class Interrupted(KeyboardInterrupt):
    """Ctrl+C during long work, with one sentence saying what was kept and how to go on.

    A KeyboardInterrupt still (cleanup written for Ctrl+C runs as before); the CLI prints the
    sentence and exits 130.
    """
