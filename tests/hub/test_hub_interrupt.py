"""Ctrl+C in `qwen-tray models get` (a real SIGINT to a real process, the download stalled on the
fake hub): one sentence saying what stays, exit 130; the same command then resumes. A failure
says that the download is kept only when something is on disk."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys

from hub_support import REPO_ROOT, TINY_MODEL, TINY_NAME, cli_env, qwen_tray, registered_models
from fake_hub import Faults

from app.hub.download import STATE_FILE
from app.progress import format_bytes
from tests.conftest import assert_one_line_error

WEIGHTS = "model.safetensors"
STALL_AT = 25 << 20  # bytes of the weights served before the fake hub stalls


def _interrupted_get(hub, env) -> subprocess.CompletedProcess:
    """`models get` until the fake hub stalls, then Ctrl+C."""
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "models", "get", TINY_NAME, "--method", "rtn"],
                            env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert hub.stalled.wait(120), "the download never reached the stall"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _dead_endpoint() -> str:
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_ctrl_c_during_the_download_keeps_it_and_the_same_command_resumes(hub, home, tiny_catalog, tiny_hub_model):
    hub.faults[WEIGHTS] = Faults(stall_after=STALL_AT)
    env = cli_env(home, HF_ENDPOINT=hub.url)
    stopped = _interrupted_get(hub, env)
    hub.release.set()
    source = home / "data" / "downloads" / f"{TINY_NAME}.hf"
    kept = sum(p.stat().st_size for p in source.iterdir() if p.name != STATE_FILE)
    part = (source / (WEIGHTS + ".part")).stat().st_size
    assert 0 < part <= STALL_AT
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr
    assert stopped.stderr.splitlines()[-1] == (
        f"qwen-tray: stopped: the download of {TINY_MODEL} is paused, what was downloaded ({format_bytes(kept)} in "
        f"{source}) is kept and the same command resumes it; nothing was registered")
    assert TINY_MODEL not in registered_models() and not (home / "data" / "models" / TINY_MODEL).exists()

    # Offline now: the error says that the download is kept, since it is.
    offline = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", _dead_endpoint(), env=env)
    assert_one_line_error(offline, "cannot reach", f"what was downloaded ({format_bytes(kept)}) is kept",
                          "the same command resumes it")

    again = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", env=env)
    assert again.returncode == 0, again.stderr
    assert [r["range"] for r in hub.requests_for("/cdn/") if r["range"]] == [f"bytes={part}-"]
    assert again.stderr.splitlines()[0].endswith(f"to {source} ({format_bytes(kept)} of it already here)")
    assert TINY_MODEL in registered_models()


def test_ctrl_c_before_the_first_byte_says_that_nothing_was_downloaded(hub, home, tiny_catalog):
    hub.faults["config.json"] = Faults(stall_after=0)  # the first file: the hub answers, then sends nothing
    stopped = _interrupted_get(hub, cli_env(home, HF_ENDPOINT=hub.url))
    hub.release.set()
    assert stopped.returncode == 130
    # the only line: no download started, so no progress was printed before it
    assert stopped.stderr.splitlines() == [
        f"qwen-tray: stopped before anything of {TINY_MODEL} was downloaded; nothing was registered"]
    assert TINY_MODEL not in registered_models()


def test_a_connection_that_breaks_is_resumed_with_one_notice(hub, home, tiny_catalog):
    """huggingface_hub warns that it resumes (twice on a console: its handler and the root's);
    the log gets our one line instead, and the download goes on within the run."""
    hub.faults[WEIGHTS] = Faults(drop_after=12 << 20)
    got = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", env=cli_env(home, HF_ENDPOINT=hub.url))
    assert got.returncode == 0, got.stderr
    assert "Trying to resume download" not in got.stderr and "Error while downloading" not in got.stderr
    notices = [line for line in got.stderr.splitlines() if "the connection broke" in line]
    assert len(notices) == 1, got.stderr
    assert notices[0].startswith(f"{WEIGHTS}: the connection broke; resuming at ")
    assert TINY_MODEL in registered_models()


def test_the_resume_notice_leaves_every_other_warning_alone(caplog):
    from app.hub.download import HUB_DOWNLOAD_LOGGER, _resume_notices
    from app.hub.progress import DOWNLOADING, RateMeter
    from app.hub.sources import RemoteFile

    seen = []
    remote = RemoteFile(WEIGHTS, 4 << 20, "http://hub.test/resolve/main/model.safetensors")
    meter = RateMeter(DOWNLOADING, remote.size, "B", seen.append, None)
    hub_log = logging.getLogger(HUB_DOWNLOAD_LOGGER)
    resume = "Error while downloading from %s: %s\nTrying to resume download..."
    with caplog.at_level(logging.WARNING), _resume_notices(remote, lambda: 1 << 20, meter):
        hub_log.warning(resume, remote.url, "connection reset")
        hub_log.warning(resume, "http://hub.test/resolve/main/other.bin", "connection reset")  # not this file's
        hub_log.warning("Error while downloading from %s: %s\nMax retries exceeded.", remote.url, "reset")
    assert [n.notice for n in seen] == [f"{WEIGHTS}: the connection broke; resuming at 1.0 MB of 4.2 MB "
                                        "(connection reset)"]
    assert [r.args[0].rsplit("/", 1)[-1] + ": " + r.getMessage().splitlines()[-1] for r in caplog.records] == [
        "other.bin: Trying to resume download...", f"{WEIGHTS}: Max retries exceeded."]
    with caplog.at_level(logging.WARNING):
        hub_log.warning(resume, remote.url, "later")  # the filter went with the download
    assert caplog.records[-1].args == (remote.url, "later") and len(seen) == 1
