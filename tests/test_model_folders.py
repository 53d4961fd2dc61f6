"""What a killed conversion leaves in the models folder (hidden staging folders) is cleaned by the
next conversion of the same name, unless a running process holds that name; a conversion's log
advances through its tensors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from app.engine.gguf_import import find_starter_gguf
from tests.conftest import assert_one_line_error
from tests.test_gguf_import import write_tiny_gguf

REPO_ROOT = Path(__file__).resolve().parents[1]


def _cli(home: Path, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "QWEN_TRAY_HOME": str(home), "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.Popen([sys.executable, "-m", "app.cli", *args], env=env, cwd=REPO_ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **popen)


def _hidden(models: Path) -> list[str]:
    return sorted(p.name for p in models.iterdir() if p.name.startswith("."))


def test_a_killed_conversion_is_cleaned_by_the_next_one(tmp_path, cli):
    home, models = tmp_path, tmp_path / "data" / "models"
    gguf = find_starter_gguf()
    proc = _cli(home, "models", "import-gguf", str(gguf), "--name", "Starter")
    try:
        # stderr is a pipe, as in a log: the conversion's lines advance by tenths of its tensors
        first, second = proc.stderr.readline(), proc.stderr.readline()
        proc.send_signal(signal.SIGKILL)  # killed: no cleanup of its own runs
        proc.wait(30)
    finally:
        proc.kill()
    assert first.startswith("converting Starter: tensors (1/"), first
    total = int(first.rstrip(")\n").split("/")[1])
    assert second == f"converting Starter: tensors ({-(-total // 10)}/{total})\n"
    [staging] = _hidden(models)
    assert staging.startswith(".Starter.") and staging.endswith(".partial")
    assert not (models / "Starter").exists()
    assert ".Starter" not in cli("models", "list").stdout

    gguf_tiny = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf_tiny, arch="qwen2")
    done = cli("models", "import-gguf", str(gguf_tiny), "--name", "Starter")
    assert done.returncode == 0, done.stderr
    assert _hidden(models) == [] and (models / "Starter" / "config.json").is_file()


def test_staging_of_a_name_a_running_process_holds_stays(tmp_path, cli):
    """A second process working on the name (its lock file held) keeps its staging folders; this
    one is refused in one sentence, and goes ahead once the other is gone."""
    models = tmp_path / "data" / "models"
    theirs = models / ".tiny.abcd1234.partial"
    theirs.mkdir(parents=True)
    lock = tmp_path / "cache" / "locks" / "model-tiny.lock"
    holder = subprocess.Popen([sys.executable, "-c", "import sys; from filelock import FileLock; "
                               f"l = FileLock({str(lock)!r}); l.acquire(); print('held', flush=True); sys.stdin.read()"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        gguf = tmp_path / "tiny.gguf"
        write_tiny_gguf(gguf, arch="qwen2")
        refused = cli("models", "import-gguf", str(gguf))
        assert_one_line_error(refused, f"{models / 'tiny'} is being written or removed by another qwen-tray process")
        assert theirs.is_dir()
    finally:
        holder.kill()
        holder.wait(30)
    done = cli("models", "import-gguf", str(gguf))
    assert done.returncode == 0, done.stderr
    assert _hidden(models) == []


def test_a_folder_moved_aside_for_a_replacement_that_never_came_is_put_back(tmp_path, cli):
    """Killed between the two renames of a replacement: the model is in `.NAME.*.old` and NAME is
    gone; the next conversion of the name puts it back instead of deleting it."""
    models = tmp_path / "data" / "models"
    gguf = tmp_path / "tiny.gguf"
    write_tiny_gguf(gguf, arch="qwen2")
    assert cli("models", "import-gguf", str(gguf)).returncode == 0
    (models / "tiny" / "mine.txt").write_text("the previous model")
    os.replace(models / "tiny", models / ".tiny.k1ll3d00.old")
    (models / ".tiny.k1ll3d00.partial").mkdir()
    again = cli("models", "import-gguf", str(gguf))
    assert again.returncode == 0, again.stderr
    assert (models / "tiny" / "mine.txt").read_text() == "the previous model"  # not converted again
    assert _hidden(models) == []
