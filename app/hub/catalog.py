"""The model catalog: recommended models as data (app/resources/catalog.toml + the user's own).

An entry says where to fetch a model (a Hugging Face repo, a ModelScope repo), which files,
and the recipe that quantizes it for a small GPU. Its architecture ([model.config], a subset
of the repo's config.json) lets the app compute, before any byte is downloaded, the download
size, the checkpoint size (the recipe planner, app/formats/recipe.py) and whether it fits this
machine (the VRAM planner `qwen-tray doctor` uses, app/engine/cuda/fit.py).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from app.errors import QwenTrayError
from app.formats.spec import ModelSpec
from app.paths import config_dir
from app.settings.models import is_plain_folder_name, windows_name_problem

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SOURCES = ("hf", "modelscope")
DEFAULT_REVISIONS = {"hf": "main", "modelscope": "master"}
# What a Qwen2 / Llama folder needs to load and quantize: not the whole repository (no README,
# no vocab.json/merges.txt: tokenizer.json holds them, no other weight formats).
DEFAULT_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "model.safetensors.index.json", "*.safetensors")
REQUIRED_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json")
USER_CATALOG = "catalog.toml"
_FIELDS = {"name", "summary", "summary_zh", "recipe", "license", "files", "hf", "modelscope", "config"}


class CatalogError(QwenTrayError):
    """A catalog file or entry is wrong (names the file and the field)."""


@dataclass(frozen=True)
class RepoRef:
    repo: str  # "Qwen/Qwen2.5-3B-Instruct"
    revision: str  # a branch, tag or commit


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    recipe: str
    sources: dict[str, RepoRef]  # "hf" / "modelscope" -> where
    files: tuple[str, ...] = DEFAULT_FILES
    config: dict = field(default_factory=dict, compare=False)
    summary: str = ""
    summary_zh: str = ""
    license: str = ""

    @property
    def spec(self) -> ModelSpec | None:
        return ModelSpec.from_hf_config(self.config, source=f"catalog entry {self.name}") if self.config else None

    def model_name(self, recipe: str | None = None) -> str:
        """The registered model's name: the entry's and its recipe's ("Qwen2.5-3B-Instruct-w4")."""
        return f"{self.name}-{Path(recipe or self.recipe).stem}"

    def ref(self, source: str) -> RepoRef:
        if source not in self.sources:
            offered = ", ".join(self.sources) or "none"
            raise CatalogError(f"{self.name} has no {source} source (it has: {offered})")
        return self.sources[source]


def catalog_files() -> list[Path]:
    """The shipped catalog, then the user's (whose entries replace shipped ones of the same name)."""
    shipped = Path(__file__).resolve().parents[1] / "resources" / "catalog.toml"
    user = config_dir() / USER_CATALOG
    return [shipped, user] if user.is_file() else [shipped]


@dataclass(frozen=True)
class Catalog:
    entries: list[CatalogEntry]
    problems: list[str]  # one sentence per user entry (or user file) that was skipped


def read_catalog(paths: list[Path] | None = None) -> Catalog:
    """The shipped catalog, then the user's. A wrong user entry (or an unreadable user file) is
    skipped and named in ``problems``: the built-in entries always work. The shipped file is the
    app's own; an error in it is a bug and raises."""
    paths = paths or catalog_files()
    entries: dict[str, CatalogEntry] = {e.name: e for e in read_catalog_file(paths[0])}
    problems: list[str] = []
    for path in paths[1:]:
        try:
            raws = _models(path)
        except CatalogError as e:
            problems.append(f"{e}; its entries are skipped")
            continue
        for index, raw in enumerate(raws):
            try:
                entry = _entry(path, index, raw)
            except CatalogError as e:
                problems.append(f"{e}; the entry is skipped")
            else:
                entries[entry.name] = entry
    return Catalog(list(entries.values()), problems)


def load_catalog(paths: list[Path] | None = None) -> list[CatalogEntry]:
    """The entries that work (see :func:`read_catalog` for the ones skipped)."""
    return read_catalog(paths).entries


def find_entry(name: str, entries: list[CatalogEntry] | None = None) -> CatalogEntry:
    entries = load_catalog() if entries is None else entries
    for entry in entries:
        if entry.name.lower() == name.lower():
            return entry
    raise CatalogError(f"no model named {name!r} in the catalog (see `qwen-tray models catalog`: "
                       f"{', '.join(e.name for e in entries)})")


def read_catalog_file(path: Path) -> list[CatalogEntry]:
    """Every entry of ``path``; the first wrong one raises a :class:`CatalogError`."""
    return [_entry(path, i, raw) for i, raw in enumerate(_models(path))]


def _models(path: Path) -> list:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CatalogError(f"{path}: cannot read the catalog ({e.strerror or e})") from None
    except tomllib.TOMLDecodeError as e:
        raise CatalogError(f"{path}: invalid TOML ({e})") from None
    models = data.get("model", [])
    if not isinstance(models, list):
        raise CatalogError(f"{path}: 'model' must be an array of tables ([[model]])")
    return models


def _entry(path: Path, index: int, raw: dict) -> CatalogEntry:
    where = f"{path}: model {index + 1}"
    if not isinstance(raw, dict):
        raise CatalogError(f"{where}: must be a table")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise CatalogError(f"{where}: unknown field(s) {', '.join(sorted(unknown))} "
                           f"(known: {', '.join(sorted(_FIELDS))})")
    name = _string(raw, "name", where, required=True)
    where = f"{path}: model {name!r}"
    if not is_plain_folder_name(name):
        raise CatalogError(f"{where}: 'name' becomes a folder name: no / \\ or :")
    problem = windows_name_problem(name)
    if problem is not None:  # (the models' folders of this entry are named after it on Windows too)
        raise CatalogError(f"{where}: 'name' {problem}")
    sources = {s: _ref(raw[s], s, where) for s in SOURCES if s in raw}
    if not sources:
        raise CatalogError(f"{where}: needs [hf] or [modelscope] with a repo")
    files = raw.get("files", list(DEFAULT_FILES))
    if not isinstance(files, list) or not files or not all(isinstance(f, str) and f for f in files):
        raise CatalogError(f"{where}: 'files' must be a non-empty list of file names or patterns")
    config = raw.get("config", {})
    if not isinstance(config, dict):
        raise CatalogError(f"{where}: 'config' must be a table (config.json fields)")
    entry = CatalogEntry(name=name, recipe=_string(raw, "recipe", where, required=True), sources=sources,
                         files=tuple(files), config=config, summary=_string(raw, "summary", where),
                         summary_zh=_string(raw, "summary_zh", where), license=_string(raw, "license", where))
    _check_recipe(entry.recipe, where)
    if config:
        try:
            entry.spec  # noqa: B018 - validates the architecture fields now, naming the entry
        except QwenTrayError as e:
            raise CatalogError(f"{where}: [config]: {e}") from None
    return entry


def _string(raw: dict, key: str, where: str, required: bool = False) -> str:
    value = raw.get(key, "")
    if not isinstance(value, str) or (required and not value.strip()):
        raise CatalogError(f"{where}: {key!r} must be a {'non-empty ' if required else ''}string")
    return value.strip()


def _ref(raw, source: str, where: str) -> RepoRef:
    if not isinstance(raw, dict) or not isinstance(raw.get("repo"), str) or raw["repo"].count("/") != 1:
        raise CatalogError(f"{where}: {source}.repo must be an \"owner/name\" repository id")
    revision = raw.get("revision", DEFAULT_REVISIONS[source])
    if not isinstance(revision, str) or not revision:
        raise CatalogError(f"{where}: {source}.revision must be a branch, tag or commit")
    return RepoRef(raw["repo"], revision)


def _check_recipe(recipe: str, where: str) -> None:
    from app.formats.recipe import load_recipe

    try:
        load_recipe(recipe)
    except QwenTrayError as e:
        raise CatalogError(f"{where}: {e}") from None
