"""What the settings tell the user: an English template and its values, translated where shown.

The settings load before the tray knows its language and without Qt, so a notice keeps its
template; the tray translates it (``app.ui.i18n.notice_text``), the CLI prints it in English.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from app.errors import QwenTrayError


@dataclass(frozen=True)
class Notice:
    template: str
    args: dict[str, str] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.template.format(**self.args)


class NoticeError(QwenTrayError):
    """An error the tray shows translated: its message is a :class:`Notice` (the CLI prints it in English)."""

    def __init__(self, template: str, **args: object):
        self.notice = Notice(template, {name: str(value) for name, value in args.items()})
        super().__init__(str(self.notice))
