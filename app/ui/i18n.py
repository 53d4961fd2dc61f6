"""UI text in English and Simplified Chinese.

A catalog keyed by the English text (no lrelease/.qm step needed on users' machines).
``tr("Open chat")`` returns the text in the current language; ``{name}`` placeholders are
filled with ``str.format`` after translation. The language comes from the system locale
unless the preferences choose one. Qt's own text (OK / Cancel / Apply, text-field context
menus) comes from the ``qtbase_zh_CN.qm`` that PySide6 ships: :func:`install_qt_translation`.
"""

from __future__ import annotations

from pathlib import Path

from app.settings.notices import Notice
from app.ui.i18n_zh import ZH_CN

# In English: without the font, Chinese would show as boxes. (README: the apt line has the package.)
NO_CHINESE_FONT = ("The Chinese UI needs a font with Chinese characters and none is installed, so its text shows "
                   "as boxes: install fonts-noto-cjk (Debian/Ubuntu; google-noto-sans-cjk-fonts on Fedora, "
                   "noto-fonts-cjk on Arch)")

_language = "en"
_qt_translator = None  # the installed QTranslator (kept alive: Qt does not own it)


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


def qt_translation_file(language: str) -> Path | None:
    """PySide6's translation of Qt's own strings for ``language``, where it ships one."""
    from PySide6.QtCore import QLibraryInfo

    if language == "en":
        return None
    path = Path(QLibraryInfo.path(QLibraryInfo.TranslationsPath)) / f"qtbase_{language}.qm"
    return path if path.is_file() else None


def install_qt_translation(app) -> bool:
    """Translate Qt's standard buttons and menus into the current language; False if none is shipped."""
    from PySide6.QtCore import QTranslator

    global _qt_translator
    if _qt_translator is not None:
        app.removeTranslator(_qt_translator)
        _qt_translator = None
    path = qt_translation_file(_language)
    if path is None:
        return _language == "en"
    translator = QTranslator(app)
    if not translator.load(str(path)):
        return False
    app.installTranslator(translator)
    _qt_translator = translator
    return True


def chinese_font_families() -> list[str]:
    """The installed font families that have Simplified Chinese glyphs (needs a QGuiApplication)."""
    from PySide6.QtGui import QFontDatabase

    return QFontDatabase.families(QFontDatabase.WritingSystem.SimplifiedChinese)


def missing_font_warning() -> str | None:
    """What to install when the UI is in Chinese and no font can show it; None when nothing is missing."""
    if _language == "zh_CN" and not chinese_font_families():
        return NO_CHINESE_FONT
    return None


def tr(text: str, **kwargs: object) -> str:
    translated = ZH_CN.get(text, text) if _language == "zh_CN" else text
    return translated.format(**kwargs) if kwargs else translated


def notice_text(notice: Notice) -> str:
    """A notice (made before the language was known, or by the settings) in the current language."""
    return tr(notice.template, **notice.args)
