"""UI text in English and Simplified Chinese.

A catalog keyed by the English text (no lrelease/.qm step needed on users' machines).
``tr("Open chat")`` returns the text in the current language; ``{name}`` placeholders are
filled with ``str.format`` after translation. The language comes from the system locale
unless the preferences choose one.
"""

from __future__ import annotations

from app.settings.notices import Notice
from app.ui.i18n_zh import ZH_CN

_language = "en"


def resolve_language(setting: str) -> str:
    """ "en" or "zh_CN": the setting itself, or for "auto" the system locale's language."""
    if setting in ("en", "zh_CN"):
        return setting
    from PySide6.QtCore import QLocale

    # QLocale() is the system locale unless the process set a default (tests do).
    return "zh_CN" if QLocale().name().lower().startswith("zh") else "en"


def set_language(setting: str) -> str:
    global _language
    _language = resolve_language(setting)
    return _language


def current_language() -> str:
    return _language


def tr(text: str, **kwargs: object) -> str:
    translated = ZH_CN.get(text, text) if _language == "zh_CN" else text
    return translated.format(**kwargs) if kwargs else translated


def notice_text(notice: Notice) -> str:
    """A notice (made before the language was known, or by the settings) in the current language."""
    return tr(notice.template, **notice.args)
