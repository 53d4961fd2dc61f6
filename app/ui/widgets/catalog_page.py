"""Settings -> Models: the model catalog (download + quantize + register) and the running job.

The table shows each catalog entry's download and checkpoint size and where the tray would
run it on this machine (the planner `qwen-tray doctor` uses). "Get" starts the job on the
worker thread of :class:`~app.ui.controllers.model_jobs.ModelJobs`; the job panel follows it
(speed, ETA, cancel) and stays valid when the dialog is closed and opened again.
"""

from __future__ import annotations

from PySide6.QtWidgets import (QAbstractItemView, QCheckBox, QComboBox, QFormLayout, QHBoxLayout, QLabel, QLineEdit,
                               QProgressBar, QPushButton, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget)

from app.engine.cuda.fit import CPU, GPU, GPU_PYTORCH, Fit
from app.errors import QwenTrayError
from app.hub.catalog import CatalogEntry, read_catalog
from app.hub.endpoint import endpoint_problem, normalize_endpoint
from app.hub.job import GetModelJob, GotModel
from app.hub.plan import plan_entry
from app.hub.progress import (CHECKING, CONVERTING, DOWNLOADING, QUANTIZING, REGISTERING, VERIFYING, JobProgress,
                              format_size_gb)
from app.progress import format_bytes
from app.ui.controllers.model_jobs import ModelJobs
from app.ui.i18n import current_language, tr
from app.ui.preferences import PreferencesStore

FIT_COLUMN = 4


def fit_label(fit: Fit | None) -> str:
    if fit is None:
        return ""
    return {GPU: tr("Fits the GPU"), GPU_PYTORCH: tr("GPU, without the kernels (slower)"),
            CPU: tr("CPU")}.get(fit.where, tr("Too large for this GPU"))


def duration_text(seconds: float) -> str:
    """Time left in the UI's language: app/hub/progress.py's format_duration, whose English the CLI keeps."""
    seconds = int(round(seconds))
    if seconds < 60:
        return tr("{s} s", s=seconds)
    if seconds < 3600:
        return tr("{min} min {s:02d} s", min=seconds // 60, s=seconds % 60)
    return tr("{h} h {min:02d} min", h=seconds // 3600, min=seconds % 3600 // 60)


def describe(progress: JobProgress) -> str:
    """One status line: stage, item, how much, speed, time left."""
    amount = (f"{format_bytes(progress.done)} / {format_bytes(progress.total)}" if progress.unit == "B"
              else f"{progress.done} / {progress.total}")
    text = {
        CHECKING: lambda: tr("Checking {item}…", item=progress.detail),
        DOWNLOADING: lambda: tr("Downloading {item}: {amount}", item=progress.detail, amount=amount),
        VERIFYING: lambda: tr("Verifying {item}: {amount}", item=progress.detail, amount=amount),
        CONVERTING: lambda: tr("Converting {item}: {amount} tensors", item=progress.detail, amount=amount),
        QUANTIZING: lambda: tr("Quantizing {item}: {amount} layers", item=progress.detail, amount=amount),
        REGISTERING: lambda: tr("Registering {item}…", item=progress.detail),
    }.get(progress.stage, lambda: progress.stage)()
    if progress.rate and progress.unit == "B":
        text += " · " + tr("{speed}/s", speed=format_bytes(progress.rate))
    if progress.eta_s is not None:
        text += " · " + tr("{time} left", time=duration_text(progress.eta_s))
    return text


class JobPanel(QWidget):
    """The running model job: a progress bar, one status line, Cancel."""

    def __init__(self, jobs: ModelJobs, parent: QWidget | None = None):
        super().__init__(parent)
        self.jobs = jobs
        self.bar = QProgressBar(textVisible=False)
        self.status = QLabel()
        self.status.setWordWrap(True)
        self.cancel = QPushButton(tr("Cancel"))
        self.cancel.clicked.connect(self._cancel)
        row = QHBoxLayout()
        row.addWidget(self.bar, 1)
        row.addWidget(self.cancel)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(row)
        layout.addWidget(self.status)
        jobs.progress.connect(self.show_progress)
        jobs.finished.connect(self._finished)
        jobs.failed.connect(lambda message: self._stopped(tr("Failed: {message}", message=message)))
        jobs.cancelled.connect(lambda: self._stopped(
            tr("Cancelled; what was done is kept and the next try resumes from it")))
        jobs.runningChanged.connect(self._running)
        self._running(jobs.running)
        if jobs.last_progress is not None:
            self.show_progress(jobs.last_progress)

    def show_progress(self, progress: JobProgress) -> None:
        if progress.total > 0:
            self.bar.setRange(0, 1000)
            self.bar.setValue(int(1000 * min(progress.done / progress.total, 1.0)))
        else:
            self.bar.setRange(0, 0)  # busy
        self.status.setText(tr("{model}: {progress}", model=self.jobs.label, progress=describe(progress)))

    def _finished(self, got: GotModel, _activate: bool) -> None:
        self.bar.setRange(0, 1)
        self.bar.setValue(1)
        where = f" ({fit_label(got.fit)})" if got.fit is not None else ""
        self.status.setText(tr("{model} is ready", model=got.name) + where)

    def _stopped(self, text: str) -> None:
        """A failed or cancelled job: an empty, still bar (not a full or busy one) and why."""
        self.bar.setRange(0, 1000)
        self.bar.reset()
        self.status.setText(text)

    def _running(self, running: bool) -> None:
        self.cancel.setEnabled(running)
        self.setVisible(running or bool(self.status.text()))

    def _cancel(self) -> None:
        self.jobs.cancel()
        self.status.setText(tr("Cancelling…"))


class CatalogPage(QWidget):
    """Recommended models to download: sizes, whether they fit, the source and the mirror."""

    def __init__(self, jobs: ModelJobs, store: PreferencesStore, parent: QWidget | None = None):
        super().__init__(parent)
        self.jobs, self.store = jobs, store
        self.entries: list[CatalogEntry] = []
        headers = [tr("Model"), tr("Recipe"), tr("Download"), tr("Checkpoint"), tr("On this machine")]
        self.table = QTableWidget(0, len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.source = QComboBox()
        self.source.addItem("Hugging Face", "hf")
        self.source.addItem(tr("ModelScope (mainland China)"), "modelscope")
        self.source.setCurrentIndex(max(self.source.findData(store.prefs.model_source), 0))
        self.mirror = QLineEdit(store.prefs.hf_mirror)
        self.mirror.setPlaceholderText(tr("optional, e.g. {url}", url="https://hf-mirror.com"))
        self.source.currentIndexChanged.connect(self._source_changed)
        self.keep_source = QCheckBox(tr("Keep the downloaded 16-bit files"))
        self.activate = QCheckBox(tr("Use it when it is ready"), checked=True)
        self.get = QPushButton(tr("Download and quantize"))
        self.get.clicked.connect(self.start_selected)
        self.error = QLabel()
        self.error.setStyleSheet("color: #b91c1c")
        self.error.setWordWrap(True)
        self.panel = JobPanel(jobs)
        jobs.runningChanged.connect(lambda running: self.get.setEnabled(not running))
        self.get.setEnabled(not jobs.running)
        form = QFormLayout()
        form.addRow(tr("Download from"), self.source)
        form.addRow(tr("Hugging Face mirror"), self.mirror)
        options = QHBoxLayout()
        for widget in (self.keep_source, self.activate):
            options.addWidget(widget)
        options.addStretch(1)
        options.addWidget(self.get)
        self.problems = QLabel()
        self.problems.setStyleSheet("color: #b45309")
        self.problems.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.problems)
        layout.addWidget(self.table, 1)
        layout.addLayout(form)
        layout.addLayout(options)
        layout.addWidget(self.error)
        layout.addWidget(self.panel)
        self._source_changed()
        self.refresh()

    def refresh(self) -> None:
        """Fill the table from the catalog, planned for this machine."""
        catalog = read_catalog()
        self.entries = catalog.entries
        self.problems.setText("\n".join(catalog.problems))  # the user entries skipped, and why
        self.problems.setVisible(bool(catalog.problems))
        machine = self.jobs.machine()
        self.table.setRowCount(len(self.entries))
        for row, entry in enumerate(self.entries):
            self._fill_row(row, entry, machine)
        self.table.resizeColumnsToContents()
        rows = sum(self.table.rowHeight(r) for r in range(min(len(self.entries), 5)))
        self.table.setMinimumHeight(self.table.horizontalHeader().height() + rows + 4)  # every entry, up to 5
        if self.entries and self.table.currentRow() < 0:
            self.table.selectRow(0)

    def _fill_row(self, row: int, entry: CatalogEntry, machine) -> None:
        """One entry's cells; an entry that cannot be planned shows why in its last cell."""
        summary = entry.summary_zh if current_language() == "zh_CN" and entry.summary_zh else entry.summary
        try:
            plan = plan_entry(entry, machine)
        except QwenTrayError as e:
            cells, fit_tip = (entry.name, entry.recipe, "?", "?", str(e)), str(e)
        else:
            cells = (entry.name, plan.recipe, _size(plan.download_bytes), _size(plan.checkpoint_bytes),
                     fit_label(plan.fit))
            fit_tip = plan.fit.text if plan.fit else summary
        for column, text in enumerate(cells):
            item = QTableWidgetItem(text)
            item.setToolTip(fit_tip if column == FIT_COLUMN else summary)
            self.table.setItem(row, column, item)

    def select(self, name: str) -> None:
        row = next(i for i, e in enumerate(self.entries) if e.name == name)
        self.table.selectRow(row)

    def start_selected(self) -> bool:
        """Start getting the selected entry; shows why not and returns False."""
        row = self.table.currentRow()
        if not 0 <= row < len(self.entries):
            self.error.setText(tr("Choose a model first"))
            return False
        entry, source = self.entries[row], self.source.currentData()
        mirror_url = normalize_endpoint(self.mirror.text())
        problem = endpoint_problem(mirror_url) if mirror_url else None
        if problem == "no scheme":
            self.error.setText(tr("“{field}” needs https:// in front, e.g. https://{url}",
                                  field=tr("Hugging Face mirror"), url=mirror_url))
            return False
        if problem == "other scheme":
            self.error.setText(tr("“{field}” must be an http(s) URL, such as https://hf-mirror.com",
                                  field=tr("Hugging Face mirror")))
            return False
        self.mirror.setText(mirror_url)
        try:
            self.store.update(model_source=source, hf_mirror=mirror_url)
        except QwenTrayError as e:
            self.error.setText(str(e))
            return False
        mirror = self.store.prefs.hf_mirror if source == "hf" else ""
        machine = self.jobs.machine()
        job = GetModelJob(entry, source=source, endpoint=mirror or None, keep_source=self.keep_source.isChecked(),
                          machine=machine, device=None if machine and machine.gpu else "cpu")
        if not self.jobs.start(job, job.name, activate=self.activate.isChecked()):
            self.error.setText(tr("Another model is being prepared; wait for it or cancel it"))
            return False
        self.error.clear()
        return True

    def _source_changed(self) -> None:
        self.mirror.setEnabled(self.source.currentData() == "hf")


def _size(nbytes: int | None) -> str:
    return "?" if nbytes is None else format_size_gb(nbytes)

