"""A download killed midway (SIGKILL) resumes where it stopped, to byte-identical files; a
connection dropped mid-file is resumed within the run; cancel keeps what was downloaded."""

from __future__ import annotations

import filecmp
import signal
import subprocess
import sys
import threading

import pytest
from hub_support import REPO_ROOT, TINY_MODEL, TINY_NAME, cli_env, qwen_tray, registered_models
from fake_hub import Faults

from app.hub.catalog import find_entry
from app.hub.job import GetModelJob
from app.hub.progress import DOWNLOADING, JobCancelled

WEIGHTS = "model.safetensors"
STALL_AT = 25 << 20  # bytes of the weights served before the fake hub stalls


def test_a_killed_download_resumes_to_identical_files(hub, home, tiny_catalog, tiny_hub_model):
    size = (tiny_hub_model / WEIGHTS).stat().st_size
    hub.faults[WEIGHTS] = Faults(stall_after=STALL_AT)
    env = cli_env(home, HF_ENDPOINT=hub.url)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "models", "get", TINY_NAME, "--method", "rtn",
                             "--keep-source"], env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert hub.stalled.wait(120), "the download never reached the stall"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        proc.kill()
    hub.release.set()
    # the killed client's response writes on into socket buffers until the server sees it gone
    assert hub.stall_ended.wait(60), "the stalled response never ended"
    source = home / "data" / "downloads" / f"{TINY_NAME}.hf"
    part = source / (WEIGHTS + ".part")
    kept = part.stat().st_size
    assert 0 < kept <= STALL_AT  # what reached the disk before the kill stays
    assert not (home / "data" / "models" / TINY_MODEL).exists() and TINY_MODEL not in registered_models()

    served_before = hub.served[WEIGHTS]
    again = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", "--keep-source", env=env)
    assert again.returncode == 0, again.stderr
    resumed = [r for r in hub.requests_for("/cdn/") if r["range"]]
    assert [r["range"] for r in resumed] == [f"bytes={kept}-"]
    assert hub.served[WEIGHTS] - served_before == size - kept  # only the rest was sent
    assert filecmp.cmp(source / WEIGHTS, tiny_hub_model / WEIGHTS, shallow=False)
    assert TINY_MODEL in registered_models()


def test_a_dropped_connection_is_resumed_within_the_run(hub, home, tiny_catalog, tiny_hub_model):
    hub.faults[WEIGHTS] = Faults(drop_after=12 << 20)
    job = GetModelJob(find_entry(TINY_NAME), method="rtn", keep_source=True, endpoint=hub.url)
    got = job.run(lambda progress: None)
    assert got.name == TINY_MODEL
    ranges = [r["range"] for r in hub.requests_for("/cdn/") if r["range"]]
    assert len(ranges) == 1 and ranges[0].startswith("bytes=")  # huggingface_hub's retry asked for the rest
    assert filecmp.cmp(job.source_folder / WEIGHTS, tiny_hub_model / WEIGHTS, shallow=False)


def test_cancel_keeps_the_download_and_registers_nothing(hub, home, tiny_catalog, tiny_hub_model):
    hub.faults[WEIGHTS] = Faults(stall_after=STALL_AT)
    cancel = threading.Event()
    seen = []

    def report(progress):
        seen.append(progress)
        if progress.stage == DOWNLOADING and progress.done >= 10 << 20:
            cancel.set()

    job = GetModelJob(find_entry(TINY_NAME), method="rtn", endpoint=hub.url)
    threading.Timer(0.5, hub.release.set).start()  # should the cancel come after the stall
    with pytest.raises(JobCancelled):
        job.run(report, cancel)
    part = job.source_folder / (WEIGHTS + ".part")
    assert part.stat().st_size >= 10 << 20
    assert not job.out.exists() and TINY_MODEL not in registered_models()
    downloading = [p for p in seen if p.stage == DOWNLOADING]
    assert downloading[-1].total == sum(p.stat().st_size for p in tiny_hub_model.iterdir() if p.is_file())
    assert any(p.rate for p in downloading) and any(p.eta_s is not None for p in downloading)


def test_a_second_get_of_the_same_model_waits_its_turn_in_one_sentence(hub, home, tiny_catalog, tiny_hub_model):
    """Two `models get` of one model at once: the second says so and touches nothing; the first
    finishes as if alone (before: the second finished and deleted the first one's files)."""
    hub.faults[WEIGHTS] = Faults(stall_after=STALL_AT)
    env = cli_env(home, HF_ENDPOINT=hub.url)
    first = subprocess.Popen([sys.executable, "-m", "app.cli", "models", "get", TINY_NAME, "--method", "rtn"],
                             env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert hub.stalled.wait(120), "the first download never reached the stall"
        second = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", env=env)
        assert second.returncode == 1 and "Traceback" not in second.stderr
        assert "being fetched by another qwen-tray process" in second.stderr
        hub.release.set()
        _out, err = first.communicate(timeout=300)
        assert first.returncode == 0, err.decode()
    finally:
        first.kill()
    assert TINY_MODEL in registered_models()
