"""Getting a model from the tray's Settings -> Models, offscreen with real widgets: the catalog with
sizes and the planner's verdict, download -> quantize -> registered -> answering while the current
model keeps answering, cancel, the mirror preference, GGUF imports with a recipe, and the warning
before a model that does not fit the GPU is added."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_hub import Faults
from hub_support import TINY_MODEL, TINY_NAME, registered_models
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from app.engine import SamplingParams
from app.engine.cuda.fit import Machine
from app.engine.cuda.memory import RTX_3050_LAPTOP, GpuInfo
from app.engine.request import PRIORITY_NORMAL
from app.hub.job import GotModel, fit_of
from app.hub.progress import DOWNLOADING, QUANTIZING, JobProgress
from app.settings.models import ModelEntry
from app.settings.store import SettingsStore
from app.ui.controllers.model_jobs import ModelJobs
from app.ui.i18n import set_language
from app.ui.models import open_backend
from app.ui.preferences import PreferencesStore
from app.ui.widgets.catalog_page import CatalogPage, JobPanel, fit_label
from tests.ui.ui_fakes import FakeHotkeys, FakeOpener, RecordingInjector

WEIGHTS = "model.safetensors"
SMALL_GPU = GpuInfo("Small GPU", 512 << 20, 200 << 20, 16, (8, 6))  # less free than the margin: no model fits
HELLO = [{"role": "user", "content": "Hello"}]


@pytest.fixture
def make_app(qtbot, home):
    from app.ui.app import TrayApp

    set_language("en")
    apps = []

    def make(opener=None):
        app = TrayApp(opener=opener or FakeOpener(), hotkey_factory=FakeHotkeys,
                      injector=RecordingInjector(QGuiApplication.clipboard(), None),
                      server_finder=lambda: (None, "no server in these tests"), language="en")
        apps.append(app)
        return app

    yield make
    for app in apps:
        app.shutdown()


def _answer(app) -> str:
    stream = app.host.backend.chat(HELLO, SamplingParams(max_tokens=4, temperature=0), PRIORITY_NORMAL)
    return stream.text()


def _row(page: CatalogPage, name: str) -> list[str]:
    row = next(i for i, e in enumerate(page.entries) if e.name == name)
    return [page.table.item(row, c).text() for c in range(page.table.columnCount())]


def test_the_catalog_shows_sizes_and_where_each_model_runs(qtbot, home):
    jobs = ModelJobs(machine=lambda: Machine(RTX_3050_LAPTOP, None))  # what the planner says for the 3050
    page = CatalogPage(jobs, PreferencesStore())
    qtbot.addWidget(page)
    assert _row(page, "Qwen2.5-3B-Instruct") == ["Qwen2.5-3B-Instruct", "w4", "6.2 GB", "1.6 GB", "Fits the GPU"]
    assert _row(page, "Qwen2.5-7B-Instruct") == ["Qwen2.5-7B-Instruct", "mixed", "15.2 GB", "3.1 GB", "Fits the GPU"]
    row = next(i for i, e in enumerate(page.entries) if e.name == "Qwen2.5-7B-Instruct")
    assert page.table.item(row, 4).toolTip().startswith("on the GPU as 1 x 3712 tokens")  # fitted to the card
    small = CatalogPage(ModelJobs(machine=lambda: Machine(SMALL_GPU, None)), PreferencesStore())
    qtbot.addWidget(small)
    assert _row(small, "Qwen2.5-1.5B-Instruct")[4] == "Too large for this GPU"


def test_get_a_model_while_the_current_one_keeps_answering(qtbot, make_app, hub, tiny_catalog, tiny_qwen_dir):
    with SettingsStore().edit() as settings:
        settings.add_model(ModelEntry("Before", path=str(tiny_qwen_dir)))
    app = make_app(open_backend)
    with qtbot.waitSignal(app.host.loaded, timeout=120_000):
        app.start()
    hub.faults[WEIGHTS] = Faults(stall_after=25 << 20)
    app.open_settings()
    page = app.settings_dialog.catalog_page
    page.select(TINY_NAME)
    page.mirror.setText(hub.url)  # the Hugging Face mirror preference
    assert page.activate.isChecked() and not page.keep_source.isChecked()
    qtbot.mouseClick(page.get, Qt.LeftButton)
    assert SettingsStore().load().preferences.hf_mirror == hub.url
    qtbot.waitUntil(hub.stalled.is_set, timeout=60_000)
    assert not page.get.isEnabled() and page.panel.cancel.isEnabled()
    assert _answer(app)  # the current model answers meanwhile
    qtbot.waitUntil(lambda: "Downloading model.safetensors" in page.panel.status.text(), timeout=10_000)
    hub.release.set()
    with qtbot.waitSignal(app.host.loaded, timeout=300_000):  # done: made active
        pass
    assert app.host.entry.name == TINY_MODEL and _answer(app)
    fit = fit_of(Path(app.host.entry.path), TINY_MODEL, app.machine())
    assert page.panel.status.text() == f"{TINY_MODEL} is ready ({fit_label(fit)})"  # here: (CPU)
    assert f"{TINY_MODEL} is ready" in app.notices
    assert TINY_MODEL in registered_models()
    assert not home_downloads().exists()  # the source is deleted by default
    assert app.settings_dialog.apply()  # Apply keeps the model the job registered
    assert TINY_MODEL in registered_models()


def test_a_download_that_could_not_be_deleted_is_said(make_app, home):
    app = make_app()
    left = home / "data" / "downloads" / f"{TINY_NAME}.hf"
    app._model_ready(GotModel(TINY_MODEL, home / "m", False, source_left=left, source_left_bytes=3_400_000_000),
                     False)
    assert app.notices[-1] == (f"The download {left} (3.4 GB) could not be deleted completely (a file in it was in "
                               "use); it can be deleted once Qwen Tray is closed")


def test_cancel_from_settings_keeps_the_partial_download(qtbot, make_app, hub, tiny_catalog):
    hub.faults[WEIGHTS] = Faults(stall_after=25 << 20)
    app = make_app()
    app.open_settings()
    page = app.settings_dialog.catalog_page
    page.select(TINY_NAME)
    page.mirror.setText(hub.url)
    assert page.start_selected()
    qtbot.waitUntil(hub.stalled.is_set, timeout=60_000)
    with qtbot.waitSignal(app.model_jobs.cancelled, timeout=60_000):
        qtbot.mouseClick(page.panel.cancel, Qt.LeftButton)
        hub.release.set()
    qtbot.waitUntil(lambda: page.get.isEnabled(), timeout=10_000)
    assert page.panel.status.text().startswith("Cancelled; what was done is kept")
    assert (home_downloads() / (WEIGHTS + ".part")).stat().st_size > 0
    assert TINY_MODEL not in registered_models()


def home_downloads() -> Path:
    from app.paths import downloads_dir

    return downloads_dir() / f"{TINY_NAME}.hf"


def test_a_mirror_that_is_not_a_url_is_refused(qtbot, make_app, tiny_catalog):
    app = make_app()
    app.open_settings()
    page = app.settings_dialog.catalog_page
    page.mirror.setText("hf-mirror.com")
    assert not page.start_selected()
    assert page.error.text() == "“Hugging Face mirror” needs https:// in front, e.g. https://hf-mirror.com"
    page.mirror.setText("ftp：//hf-mirror.com")  # (a full-width colon, as a Chinese input method types it)
    assert not page.start_selected()
    assert page.error.text() == "“Hugging Face mirror” must be an http(s) URL, such as https://hf-mirror.com"
    assert not app.model_jobs.running


def test_a_mirror_typed_with_a_full_width_colon_is_taken_as_its_url(qtbot, make_app, tiny_catalog):
    mirror = _unreachable_mirror()  # the job fails at once
    app = make_app()
    app.open_settings()
    page = app.settings_dialog.catalog_page
    page.select(TINY_NAME)
    page.mirror.setText(mirror.replace("://", "：／／"))  # as a Chinese input method types it
    with qtbot.waitSignal(app.model_jobs.failed, timeout=60_000):
        assert page.start_selected()
    assert page.mirror.text() == mirror and app.store.prefs.hf_mirror == mirror
    qtbot.waitUntil(lambda: page.get.isEnabled(), timeout=10_000)
    assert page.panel.status.text().startswith(f"Failed: cannot reach {mirror} (ConnectError")


def test_a_gguf_from_settings_is_quantized_into_a_checkpoint(qtbot, make_app, tmp_path):
    from tests.test_gguf_import import write_tiny_gguf

    from app.paths import models_dir

    gguf = tmp_path / "tiny-qwen2.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    app = make_app()
    app.open_settings()
    page = app.settings_dialog.models_page
    page.kind.setCurrentIndex(page.kind.findData("gguf"))
    assert page.recipe.isEnabled() and page.recipe.currentData() == "w4"
    page.name.setText("Tiny Qwen2")
    page.path.setText(str(tmp_path / "not-a-gguf.bin"))
    assert not page.add_from_form() and ".gguf file" in page.error.text()
    page.path.setText(str(gguf))
    with qtbot.waitSignal(app.model_jobs.finished, timeout=120_000):
        assert page.add_from_form()
    folder = models_dir() / "Tiny Qwen2"
    assert (folder / "manifest.json").is_file()  # a checkpoint, not a float16 folder
    assert registered_models()["Tiny Qwen2"] == str(folder)
    assert [page.list.item(i).text() for i in range(page.list.count())][-1] == "Tiny Qwen2"
    assert app.settings_dialog.apply() and "Tiny Qwen2" in registered_models()


def test_a_float16_gguf_that_does_not_fit_the_gpu_is_registered_with_a_warning(qtbot, make_app, tmp_path):
    from tests.test_gguf_import import write_tiny_gguf

    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    app = make_app()
    app.model_jobs.machine = lambda: Machine(SMALL_GPU, None)
    app.open_settings()
    page = app.settings_dialog.models_page
    page.kind.setCurrentIndex(page.kind.findData("gguf"))
    page.recipe.setCurrentIndex(page.recipe.findData(""))  # float16
    page.name.setText("Tiny fp16")
    page.path.setText(str(gguf))
    with qtbot.waitSignal(app.model_jobs.finished, timeout=120_000):
        assert page.add_from_form()
    qtbot.waitUntil(lambda: any("Tiny fp16 does not fit this GPU" in n for n in app.notices), timeout=10_000)
    assert "Tiny fp16" in registered_models()


def test_a_float16_folder_that_does_not_fit_the_gpu_needs_a_second_click(qtbot, make_app, tiny_qwen_dir):
    app = make_app()
    app.model_jobs.machine = lambda: Machine(SMALL_GPU, None)
    app.open_settings()
    page = app.settings_dialog.models_page
    page.name.setText("Big")
    page.path.setText(str(tiny_qwen_dir))
    assert not page.add_from_form()
    assert page.error.text().startswith("Big is not quantized and does not fit this GPU (refused: ")
    assert page.add_from_form()  # said so; the user adds it anyway
    assert app.settings_dialog.apply() and "Big" in registered_models()


def test_a_gguf_entry_saved_before_is_still_converted_on_first_load(home, tmp_path):
    from tests.test_gguf_import import write_tiny_gguf

    from app.paths import models_dir

    gguf = tmp_path / "old.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    stages = []
    backend = open_backend(ModelEntry("Old GGUF", kind="gguf", path=str(gguf)),
                           progress=lambda stage, done, total: stages.append(stage))
    try:
        assert (models_dir() / "Old GGUF" / "config.json").is_file() and "converting GGUF" in stages
        assert registered_models()["Old GGUF"] == str(models_dir() / "Old GGUF")
    finally:
        backend.close()


def test_the_job_panel_says_the_time_left_in_the_uis_language(qtbot):
    jobs = ModelJobs(machine=lambda: None)
    jobs.label = "Qwen2.5-3B-Instruct"  # (as a started job sets it)
    panel = JobPanel(jobs)
    qtbot.addWidget(panel)
    download = JobProgress(DOWNLOADING, 1_500_000_000, 6_200_000_000, "B", 12_000_000, 3905, "model.safetensors")
    quantize = JobProgress(QUANTIZING, 12, 36, "layer", None, 185, "Qwen2.5-3B-Instruct")
    set_language("zh_CN")
    try:
        panel.show_progress(download)
        assert panel.status.text() == ("Qwen2.5-3B-Instruct：正在下载 model.safetensors：1.5 GB / 6.2 GB · "
                                       "12.0 MB/秒 · 剩余 1 小时 05 分")
        panel.show_progress(quantize)
        assert panel.status.text().endswith("12 / 36 层 · 剩余 3 分 05 秒")
        panel.show_progress(JobProgress(QUANTIZING, 35, 36, "layer", None, 9, "Qwen2.5-3B-Instruct"))
        assert panel.status.text().endswith("35 / 36 层 · 剩余 9 秒")
    finally:
        set_language("en")
    panel.show_progress(download)
    assert panel.status.text().endswith("12.0 MB/s · 1 h 05 min left")  # as the CLI says it


def test_a_failed_download_leaves_an_empty_bar_and_advice_in_settings_words(qtbot, make_app, tiny_catalog):
    mirror = _unreachable_mirror()
    app = make_app()
    app.open_settings()
    page = app.settings_dialog.catalog_page
    page.select(TINY_NAME)
    page.mirror.setText(mirror)
    with qtbot.waitSignal(app.model_jobs.failed, timeout=60_000):
        assert page.start_selected()
    qtbot.waitUntil(lambda: page.get.isEnabled(), timeout=10_000)
    text = page.panel.status.text()
    assert text.startswith(f"Failed: cannot reach {mirror} (ConnectError")
    assert "the address in “Hugging Face mirror”" in text and "ModelScope in “Download from”" in text
    assert "HF_ENDPOINT" not in text and "--" not in text
    bar = page.panel.bar
    assert bar.maximum() > 0 and bar.value() < bar.minimum()  # reset: empty, not busy or full


def _unreachable_mirror() -> str:
    """A loopback URL nobody listens on (its port was free a moment ago)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"
