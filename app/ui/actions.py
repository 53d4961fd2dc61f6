"""Hotkey actions as data: the built-ins from ``app/resources/actions.toml`` plus the user's own
(kept in the settings file, app/settings/actions.py says what an action is).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from app.paths import resources_dir
from app.settings.actions import Action, ActionError, action_from_mapping
from app.settings.notices import Notice

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

DEFAULT_OPEN_CHAT_HOTKEY = "Ctrl+Alt+Space"
RENAMED = "Your action {name} had the id {id}, which another action already uses; it is now {new_id}"


def load_builtin_actions(path: Path | None = None) -> list[Action]:
    path = path or resources_dir() / "actions.toml"
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ActionError(f"{path}: cannot read the built-in actions ({e})") from None
    tables = data.get("action", [])
    return [action_from_mapping(d, builtin=True, where=f"{path} action #{i + 1}") for i, d in enumerate(tables)]


def with_unique_ids(user: list[Action], builtin: list[Action]) -> tuple[list[Action], list[Notice]]:
    """The user's actions, each whose id a built-in (or an earlier one of the user's) already has
    renamed to a free id, with a notice for each: ids must stay unique, and a clash never stops the tray."""
    taken = {a.id for a in builtin}
    unique, notices = [], []
    for action in user:
        if action.id in taken:
            new_id = new_action_id(action.name, taken)
            notices.append(Notice(RENAMED, {"name": action.name, "id": action.id, "new_id": new_id}))
            action = Action(**{**action.to_dict(), "id": new_id})
        taken.add(action.id)
        unique.append(action)
    return unique, notices


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
