"""Settings → Models → Remove: the question before a model is removed, saying what will happen.

A folder the app made: "Remove NAME and delete its files (SIZE) from FOLDER?" with "Keep the
files" (unticked); anything else: only the entry goes and the files stay, and why. A model the
tray has loaded is unloaded first, and it says so. Opened window-modal (``open()``), so the tray
keeps running while it is shown.
"""

from __future__ import annotations

from PySide6.QtWidgets import QCheckBox, QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from app.progress import format_bytes
from app.model_removal import RemovalPlan
from app.ui.controllers.model_removal import kept_reason
from app.ui.i18n import tr


class RemoveModelDialog(QDialog):
    def __init__(self, plan: RemovalPlan, in_use: bool, parent: QWidget | None = None):
        super().__init__(parent)
        self.plan = plan
        self.setWindowTitle(tr("Remove {name}", name=plan.entry.name))
        self.message = QLabel(confirmation_text(plan, in_use), wordWrap=True)
        self.keep_files = QCheckBox(tr("Keep the files"))
        self.keep_files.setVisible(plan.delete)  # only a folder the app made is deleted at all
        buttons = QDialogButtonBox(QDialogButtonBox.Cancel)
        self.remove_button = buttons.addButton(tr("Remove"), QDialogButtonBox.DestructiveRole)
        self.remove_button.clicked.connect(self.accept)
        buttons.rejected.connect(self.reject)
        buttons.button(QDialogButtonBox.Cancel).setDefault(True)  # Enter does not delete anything
        layout = QVBoxLayout(self)
        layout.addWidget(self.message)
        layout.addWidget(self.keep_files)
        layout.addWidget(buttons)

    @property
    def keeps_files(self) -> bool:
        return not self.plan.delete or self.keep_files.isChecked()


def confirmation_text(plan: RemovalPlan, in_use: bool) -> str:
    name = plan.entry.name
    if plan.delete:
        text = tr("Remove {name} and delete its files ({size}) from {folder}?", name=name,
                  size=format_bytes(plan.nbytes), folder=str(plan.folder))
    else:
        text = tr("Remove {name}? Only its entry is removed: {why}.", name=name, why=kept_reason(plan))
    if in_use:
        text += "\n\n" + tr("Qwen Tray is using {name}: it is unloaded first, then the default model is loaded.",
                            name=name)
    return text
