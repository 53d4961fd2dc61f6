"""Hotkey actions as data: the built-ins from ``app/resources/actions.toml`` plus the user's own.

User actions live in ``<config>/actions.json`` (JSON because Python 3.10 can read TOML
with tomli but nothing in the standard library writes it).
"""

from __future__ import annotations

import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from app.errors import QwenTrayError
from app.ui.i18n import Notice
from app.ui.jsonfile import CorruptFileError, back_up_corrupt, read_json, write_json_atomic
from app.ui.paths import config_dir, resources_dir

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

MODES = ("popup", "replace")
LONG_TEXT = ("map_reduce", "chunks")
OPEN_CHAT_ID = "open_chat"  # the non-action hotkey binding
DEFAULT_OPEN_CHAT_HOTKEY = "Ctrl+Alt+Space"
_DEFAULT_COMBINE = "Combine these answers about consecutive parts of one text into one answer.\n\n{text}"


class ActionError(QwenTrayError):
    """An action definition is invalid (names the action and the field)."""


@dataclass(frozen=True)
class Action:
    id: str
    name: str
    prompt: str
    name_zh: str = ""
    system: str = ""
    hotkey: str = ""
    mode: str = "popup"
    long_text: str = "map_reduce"
    combine_prompt: str = _DEFAULT_COMBINE
    builtin: bool = False

    def __post_init__(self) -> None:
        where = f"action {self.id or self.name!r}"
        if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", self.id):
            raise ActionError(f"{where}: id must be lowercase letters, digits, '-' or '_'")
        if self.id == OPEN_CHAT_ID:
            raise ActionError(f"{where}: id {OPEN_CHAT_ID!r} is reserved")
        if not self.name.strip():
            raise ActionError(f"{where}: name is empty")
        if "{text}" not in self.prompt:
            raise ActionError(f"{where}: prompt must contain {{text}} where the selected text goes")
        if self.mode not in MODES:
            raise ActionError(f"{where}: mode must be one of {', '.join(MODES)}")
        if self.long_text not in LONG_TEXT:
            raise ActionError(f"{where}: long_text must be one of {', '.join(LONG_TEXT)}")
        if "{text}" not in self.combine_prompt:
            raise ActionError(f"{where}: combine_prompt must contain {{text}}")

    def label(self, language: str) -> str:
        return self.name_zh if language == "zh_CN" and self.name_zh else self.name


def _from_mapping(data: dict, *, builtin: bool, where: str) -> Action:
    if not isinstance(data, dict):
        raise ActionError(f"{where}: each action must be a table/object")
    allowed = {"id", "name", "prompt", "name_zh", "system", "hotkey", "mode", "long_text", "combine_prompt"}
    unknown = set(data) - allowed
    if unknown:
        raise ActionError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for key in ("id", "name", "prompt"):
        if not isinstance(data.get(key), str):
            raise ActionError(f"{where}: field {key!r} is missing or not a string")
    return Action(**data, builtin=builtin)


def load_builtin_actions(path: Path | None = None) -> list[Action]:
    path = path or resources_dir() / "actions.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ActionError(f"{path}: cannot read the built-in actions ({e})") from e
    tables = data.get("action", [])
    return [_from_mapping(d, builtin=True, where=f"{path} action #{i + 1}") for i, d in enumerate(tables)]


def user_actions_path() -> Path:
    return config_dir() / "actions.json"


def load_user_actions(path: Path | None = None) -> tuple[list[Action], Notice | None]:
    """The user's actions and a notice when the file was broken (it is then backed up)."""
    path = path or user_actions_path()
    try:
        data = read_json(path)
        if data is None:
            return [], None
        if not isinstance(data, list):
            raise CorruptFileError(f"{path}: expected a list of actions")
        return [_from_mapping(d, builtin=False, where=f"{path} item #{i + 1}") for i, d in enumerate(data)], None
    except (CorruptFileError, ActionError) as e:
        backup = back_up_corrupt(path)
        return [], Notice("Your actions file was unreadable and has been moved to {backup} ({error})",
                          {"backup": str(backup), "error": str(e)})


def save_user_actions(actions: list[Action], path: Path | None = None) -> None:
    rows = []
    for a in actions:
        row = asdict(a)
        del row["builtin"]
        rows.append(row)
    write_json_atomic(path or user_actions_path(), rows)


def all_actions(user: list[Action], builtin: list[Action] | None = None) -> list[Action]:
    """Built-ins first; a user action with a built-in's id is refused (ids must stay unique)."""
    builtin = load_builtin_actions() if builtin is None else builtin
    ids = {a.id for a in builtin}
    clashes = [a.id for a in user if a.id in ids]
    if clashes:
        raise ActionError(f"user action id(s) {', '.join(clashes)} clash with built-in actions")
    return [*builtin, *user]


def new_action_id(name: str, taken: set[str]) -> str:
    """A free id for a user action named ``name`` ("My Thing!" -> "user-my-thing")."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "action"
    candidate, n = f"user-{slug}", 2
    while candidate in taken:
        candidate, n = f"user-{slug}-{n}", n + 1
    return candidate


# -- prompts ----------------------------------------------------------------------------

def is_mostly_chinese(text: str) -> bool:
    """True when CJK ideographs make up at least 30 % of the letters (mixed text counts as Chinese)."""
    letters = [ch for ch in text if ch.isalpha()]
    if not letters:
        return False
    han = sum(1 for ch in letters if "\u4e00" <= ch <= "\u9fff" or "\u3400" <= ch <= "\u4dbf")
    return han / len(letters) >= 0.3


def target_language_for(text: str, setting: str) -> str:
    """Translation target: the setting, or with "auto" Chinese -> English and anything else -> Chinese."""
    if setting and setting != "auto":
        return setting
    return "English" if is_mostly_chinese(text) else "Simplified Chinese"


def build_messages(action: Action, text: str, translate_target: str = "auto", *,
                   template: str | None = None) -> list[dict[str, str]]:
    """Chat messages for ``action`` on ``text`` (``template`` overrides the prompt, for combine steps)."""
    template = action.prompt if template is None else template
    # {target_language} first, so a literal "{target_language}" inside the user's text stays as is.
    user = template.replace("{target_language}", target_language_for(text, translate_target)).replace("{text}", text)
    messages = [{"role": "system", "content": action.system}] if action.system else []
    messages.append({"role": "user", "content": user})
    return messages
