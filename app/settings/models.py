"""The model registry's entries: a local folder, a GGUF file, the starter model or a remote endpoint.

One list of :class:`ModelEntry` in the settings file serves ``qwen-tray models``, ``ask``,
``serve``, ``doctor`` and the tray. A GGUF entry becomes a local one (same name, the converted
folder) the first time it is loaded; the starter entry is never stored: the tray offers it
until it is registered as a local folder.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from app.errors import QwenTrayError

KINDS = ("local", "gguf", "starter", "remote")
DEFAULT_REMOTE_CONTEXT = 32768
# A name is a folder's name, and its staging folders' (".NAME.<random>.partial", ".NAME.fp16"):
# file systems take 255 bytes, so a name keeps well below that, in characters and in UTF-8 bytes.
MAX_NAME_CHARS = 100
MAX_NAME_BYTES = 200


class ModelEntryError(QwenTrayError):
    """A model entry is incomplete or wrong, or its name cannot be used (names the entry)."""


def is_plain_folder_name(name: str) -> bool:
    """A model name that can be a folder of its own under models_dir() (no separators, no . / ..).
    What a registered entry read from the settings file must be; a new name must pass
    :func:`check_model_name`, which also refuses what Windows cannot take."""
    return bool(name.strip()) and not any(c in name for c in "/\\:") and name.strip() not in (".", "..")


# What NTFS refuses in a file or folder name (besides control characters), and the device names
# Windows reserves: "NUL" or "nul.txt" opens the device, not a folder (Microsoft: "Naming Files,
# Paths, and Namespaces"). A name is refused on every platform: a settings file or a model
# folder may move to a Windows machine, and the same name should work everywhere.
WINDOWS_FORBIDDEN = '<>:"/\\|?*'
WINDOWS_DEVICES = frozenset({"CON", "PRN", "AUX", "NUL", *(f"{port}{n}" for port in ("COM", "LPT")
                                                            for n in "0123456789\u00b9\u00b2\u00b3")})


def windows_name_problem(name: str) -> str | None:
    """Why Windows cannot have a folder named ``name`` (a phrase that follows the name), or None."""
    forbidden = next((c for c in name if c in WINDOWS_FORBIDDEN), None)
    if forbidden is not None:
        return f"contains {forbidden!r}, which Windows does not allow in a folder name (nor any of < > : \" / \\ | ? *)"
    if name.endswith((".", " ")):
        return (f"ends in {'a dot' if name.endswith('.') else 'a space'}, which Windows drops from a folder name "
                f"(it would be the folder of {name.rstrip('. ')!r})")
    device = name.split(".", 1)[0].rstrip(" ").upper()
    if device in WINDOWS_DEVICES:
        return (f"names the device {device} on Windows (CON, PRN, AUX, NUL, COM0-9 and LPT0-9 do, also with an "
                "extension), not a folder")
    return None


def check_model_name(name: str) -> str:
    """A new model's name, stripped; every new entry (CLI or tray) must have a plain one, which
    every platform can make a folder of."""
    if not name.strip():
        raise ModelEntryError("the model name is empty")
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        raise ModelEntryError(f"model name {name!r} contains control characters")
    if not is_plain_folder_name(name):
        raise ModelEntryError(f"model name {name!r} must be a plain folder name (no / \\ or :, not . or ..)")
    name = name.strip()
    problem = windows_name_problem(name)
    if problem is not None:
        raise ModelEntryError(f"model name {name!r} {problem}; choose another")
    if len(name) > MAX_NAME_CHARS or len(name.encode("utf-8")) > MAX_NAME_BYTES:
        raise ModelEntryError(f"model name {name[:20] + '…'!r} is too long ({len(name)} characters); use at most "
                              f"{MAX_NAME_CHARS} characters ({MAX_NAME_BYTES} bytes in UTF-8, about "
                              f"{MAX_NAME_BYTES // 3} Chinese characters): a folder is named after it")
    return name


@dataclass(frozen=True)
class ModelEntry:
    name: str
    kind: str = "local"
    path: str = ""  # local: HF folder or checkpoint; gguf: a .gguf file (converted once on first load)
    base_url: str = ""  # remote: e.g. https://api.example.com/v1
    api_key: str = ""
    model: str = ""  # remote: the model id the endpoint expects
    max_context: int = DEFAULT_REMOTE_CONTEXT  # remote: used to decide when to split long text

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int if f.name == "max_context" else str) or isinstance(value, bool):
                raise ModelEntryError(f"model {self.name!r}: {f.name} must be "
                                      f"{'an integer' if f.name == 'max_context' else 'a string'}")
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
        if self.max_context < 256:
            raise ModelEntryError(f"model {self.name!r}: max_context must be an integer >= 256")

    def to_dict(self) -> dict:
        """The entry as the settings file holds it: name, kind and the fields that differ from the default."""
        data = {"name": self.name, "kind": self.kind}
        defaults = ModelEntry.__dataclass_fields__
        data.update({f.name: getattr(self, f.name) for f in fields(self)
                     if f.name not in data and getattr(self, f.name) != defaults[f.name].default})
        return data

    @classmethod
    def from_dict(cls, data: object) -> ModelEntry:
        if not isinstance(data, dict):
            raise ModelEntryError("a model entry must be an object")
        known = {f.name for f in fields(cls)}
        return cls(**{"name": "", **{k: v for k, v in data.items() if k in known}})

    @property
    def is_local_engine(self) -> bool:
        return self.kind in ("local", "gguf", "starter")

    def describe(self) -> str:
        """Where the entry's model is, for `models list` and `doctor`."""
        if self.kind == "remote":
            return f"remote {self.base_url} (model {self.model})"
        if self.kind == "gguf":
            return f"GGUF file {self.path} (converted when first loaded)"
        return self.path


def rebase_models(current: list[ModelEntry], before: list[ModelEntry], after: list[ModelEntry]) -> list[ModelEntry]:
    """The registry ``current`` (as on disk now) with the edits that turned ``before`` into
    ``after`` (a dialog's list when it opened and now): entries removed there are removed,
    changed or added ones take their place or are appended, and what someone else registered
    meanwhile (a CLI command, a download) stays."""
    before_by_name = {m.name: m for m in before}
    after_names = {m.name for m in after}
    removed = before_by_name.keys() - after_names
    edited = {m.name: m for m in after if before_by_name.get(m.name) != m}
    rebased = [edited.pop(m.name, m) for m in current if m.name not in removed]
    return rebased + list(edited.values())
