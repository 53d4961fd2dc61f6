"""`qwen-tray serve` of a registered model: clients know it by the name the user registered."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading

import pytest

from server_helpers import wait_until

REPO = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
MAIN = "import sys; from app.cli import main; sys.exit(main(sys.argv[1:]))"


def _qwen_tray(home, *args: str, **popen) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "QWEN_TRAY_HOME": str(home)}
    return subprocess.Popen([sys.executable, "-c", MAIN, *args], stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=env, cwd=REPO, **popen)


def _register(home, name: str, folder) -> None:
    proc = _qwen_tray(home, "models", "add", name, str(folder), "--default")
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err


@pytest.mark.skipif(not hasattr(signal, "SIGTERM") or os.name == "nt", reason="POSIX signals")
def test_serve_advertises_and_answers_to_the_registered_name(tmp_path, tiny_qwen_dir):
    import openai

    folder = tmp_path / "wt-mymodel"
    shutil.copytree(tiny_qwen_dir, folder)
    home = tmp_path / "home"
    _register(home, "mine", folder)
    proc = _qwen_tray(home, "-v", "serve", "--port", "0", "--device", "cpu", "--keep-alive", "-1")
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stderr.readline, "")), daemon=True)
    reader.start()
    try:
        wait_until(lambda: any("ready:" in line for line in lines) or proc.poll() is not None, timeout=90,
                   what="the server to load")
        ready = next(line for line in lines if "ready:" in line)
        assert "model 'mine'" in ready
        client = openai.OpenAI(base_url=ready.split("OpenAI base URL ")[1].split()[0], api_key="unused",
                               max_retries=0, timeout=60)
        assert [m.id for m in client.models.list().data] == ["mine"]
        answer = client.chat.completions.create(model="mine", messages=[{"role": "user", "content": "Hi"}],
                                                max_tokens=3, temperature=0)
        assert answer.model == "mine" and answer.choices[0].message.content
        # The folder's name (the id before names were kept) is an alias; responses say the id.
        by_folder = client.chat.completions.create(model="wt-mymodel", messages=[{"role": "user", "content": "Hi"}],
                                                   max_tokens=3, temperature=0)
        assert by_folder.model == "mine"
        assert client.models.retrieve("wt-mymodel").id == "mine"
        with pytest.raises(openai.NotFoundError) as info:
            client.chat.completions.create(model="other", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
        assert info.value.code == "model_not_found"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        reader.join(timeout=5)
    log = "".join(lines)
    assert proc.returncode == 0, log
    assert "loaded mine on cpu" in log and "wt-mymodel on" not in log


def test_ask_logs_the_registered_name(cli, tmp_path, tiny_qwen_dir, caplog):
    import logging

    folder = tmp_path / "wt-q4"
    shutil.copytree(tiny_qwen_dir, folder)
    assert cli("models", "add", "q4", str(folder), "--default").returncode == 0
    with caplog.at_level(logging.INFO, logger="app.engine"):
        assert cli("ask", "--device", "cpu", "--max-tokens", "2", "hi").returncode == 0
    assert any(r.getMessage().startswith("loaded q4 on cpu") for r in caplog.records), caplog.text
