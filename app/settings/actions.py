"""What an action is: an id, a name, a prompt with ``{text}``, an optional hotkey and answer mode.

The built-in actions ship in ``app/resources/actions.toml`` (loaded by app/ui/actions.py); the
user's own live in the settings file's ``actions`` list. Reading that list keeps every action
it can: a bad optional value (mode, hotkey, ...) falls back to its default, an action without
a usable id, name or prompt is left out; each with a problem the user is told about.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields

from app.errors import QwenTrayError
from app.settings.keys import HotkeyError, normalize_hotkey

MODES = ("popup", "replace")
LONG_TEXT = ("map_reduce", "chunks")
OPEN_CHAT_ID = "open_chat"  # the non-action hotkey binding
DEFAULT_COMBINE = "Combine these answers about consecutive parts of one text into one answer.\n\n{text}"
REQUIRED = ("id", "name", "prompt")
PROBE_PREFIX = "action 'probe': "


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
    combine_prompt: str = DEFAULT_COMBINE
    builtin: bool = False

    def __post_init__(self) -> None:
        where = f"action {(self.id or self.name)!r}"
        for f in fields(self):
            if f.name != "builtin" and not isinstance(getattr(self, f.name), str):
                raise ActionError(f"{where}: field {f.name!r} must be a string")
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
        try:
            object.__setattr__(self, "hotkey", normalize_hotkey(self.hotkey))
        except HotkeyError as e:
            raise ActionError(f"{where}: {e}") from None

    def label(self, language: str) -> str:
        return self.name_zh if language == "zh_CN" and self.name_zh else self.name

    def to_dict(self) -> dict:
        """The action as the settings file holds it: id, name, prompt and the fields not at their default."""
        row = asdict(self)
        del row["builtin"]
        defaults = Action.__dataclass_fields__
        return {k: v for k, v in row.items() if k in REQUIRED or v != defaults[k].default}


def action_from_mapping(data: object, *, builtin: bool, where: str) -> Action:
    """An action from a TOML table / JSON object, strictly: any bad or unknown field is an ActionError."""
    if not isinstance(data, dict):
        raise ActionError(f"{where}: each action must be a table/object")
    unknown = set(data) - _field_names()
    if unknown:
        raise ActionError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}")
    for key in REQUIRED:
        if not isinstance(data.get(key), str):
            raise ActionError(f"{where}: field {key!r} is missing or not a string")
    try:
        return Action(**data, builtin=builtin)
    except ActionError as e:
        raise ActionError(f"{where}: {e}") from None


def salvage_user_action(data: object, where: str) -> tuple[Action | None, list[str]]:
    """A user action with each bad optional field at its default, or None when it cannot be used;
    and the problems found (one sentence each)."""
    try:
        return action_from_mapping(data, builtin=False, where=where), []
    except ActionError as first:
        if not isinstance(data, dict):
            return None, [str(first)]
    problems = []
    unknown = sorted(set(data) - _field_names())
    if unknown:
        problems.append(f"{where}: unknown field(s) {', '.join(unknown)} left out")
    values = {k: v for k, v in data.items() if k in _field_names()}
    defaults = {f.name: f.default for f in fields(Action) if f.name not in REQUIRED}
    for name in [k for k in values if k not in REQUIRED]:
        try:
            Action(**{"id": "probe", "name": "probe", "prompt": "{text}", name: values[name]})  # this field alone
        except (ActionError, TypeError) as e:
            problems.append(f"{where}: {str(e).removeprefix(PROBE_PREFIX)}; using the default {defaults[name]!r}")
            del values[name]
    try:
        action = action_from_mapping(values, builtin=False, where=where)
    except ActionError as e:
        return None, [f"{e}; the action was left out"]
    return action, problems


def _ascii_folded(text: str) -> str:
    """``text`` with its ASCII letters in lower case: "Summarize" = "summarize"; other scripts as they are."""
    return "".join(c.lower() if c.isascii() else c for c in text.strip())


def find_action(actions: list[Action], wanted: str) -> Action:
    """The action ``wanted`` names: its id, else its English or Chinese name (exact, ASCII case ignored),
    since a user action named in Chinese gets an id like user-action-2. Raises ActionError when no
    action has that name, or several do (their ids tell them apart)."""
    by_id = next((a for a in actions if a.id == wanted), None)
    if by_id is not None:
        return by_id
    key = _ascii_folded(wanted)
    named = [a for a in actions if key and key in (_ascii_folded(a.name), _ascii_folded(a.name_zh))]
    if len(named) == 1:
        return named[0]
    if named:
        raise ActionError(f"{wanted!r} is the name of several actions: use its id "
                          f"({', '.join(a.id for a in named)}; `qwen-tray action --list` shows them)")
    raise ActionError(f"there is no action {wanted!r} (`qwen-tray action --list` shows them)")


def _field_names() -> set[str]:
    return {f.name for f in fields(Action)} - {"builtin"}
