"""`qwen-tray models catalog / get` against a loopback fake hub, with the real huggingface_hub
client: download -> quantize -> registered -> answers; HF_ENDPOINT, proxies, ModelScope."""

from __future__ import annotations

import filecmp
import json
import re

from hub_support import TINY_MODEL, TINY_NAME, TINY_REPO, cli_env, qwen_tray, registered_models

from app.engine.cuda.fit import Machine
from app.hub.catalog import find_entry
from app.hub.download import STATE_FILE
from app.hub.job import fit_of
from app.hub.plan import plan_entry
from app.progress import format_bytes
from tests.conftest import assert_one_line_error


def test_catalog_lists_the_shipped_models_with_sizes_and_this_machine(cli, tiny_catalog):
    out = cli("models", "catalog").stdout
    for name, recipe in (("Qwen2.5-3B-Instruct", "w4"), ("Qwen2.5-7B-Instruct", "mixed"),
                         ("Qwen2.5-1.5B-Instruct", "w4"), (TINY_NAME, "w4")):
        assert f"{name}  (recipe {recipe}; download " in out
    # Qwen2.5-3B in bf16 is 6.17 GB on the hub; its w4 checkpoint ~1.6 GB (the recipe planner).
    assert "Qwen2.5-3B-Instruct  (recipe w4; download 6.2 GB, checkpoint 1.6 GB)" in out
    three_b = plan_entry(find_entry("Qwen2.5-3B-Instruct"), Machine.detect()).fit
    assert f"this machine: {three_b.text}" in out  # the planner's verdict (here, without a GPU: on the CPU)
    assert "modelscope: qwen/Qwen2.5-7B-Instruct" in out


def test_get_downloads_quantizes_registers_and_the_model_answers(hub, home, tiny_catalog, tiny_hub_model):
    env = cli_env(home, HF_ENDPOINT=hub.url)
    got = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", "--keep-source", env=env)
    assert got.returncode == 0, got.stderr
    checkpoint = home / "data" / "models" / TINY_MODEL
    assert f"{TINY_MODEL} (default): {checkpoint}" in got.stdout
    assert f"the tray runs it {fit_of(checkpoint, TINY_MODEL, Machine.detect()).text}" in got.stdout
    assert (checkpoint / "manifest.json").is_file()
    source = home / "data" / "downloads" / f"{TINY_NAME}.hf"
    _assert_logged_stages(got.stderr, source, checkpoint)
    assert json.loads((checkpoint / "manifest.json").read_text())["model_id"] == TINY_REPO  # not "Tiny-Qwen2.hf"
    for name in ("model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json",
                 "generation_config.json"):
        assert filecmp.cmp(source / name, tiny_hub_model / name, shallow=False), name
    assert not list(source.glob("*.part"))
    # Every request went to the endpoint HF_ENDPOINT names, at the commit model_info resolved.
    assert hub.requests_for("/api/models/tiny-org/Tiny-Qwen2/revision/main")
    assert all("/resolve/0123456789abcdef" in r["path"] for r in hub.requests_for("/resolve/"))
    listed = qwen_tray("models", "list", env=env)
    assert f"* {TINY_MODEL}  {checkpoint}" in listed.stdout
    answer = qwen_tray("ask", "--model", TINY_MODEL, "--max-tokens", "4", "--temperature", "0", "Hello", env=env)
    assert answer.returncode == 0, answer.stderr
    assert answer.stdout.strip()


def _assert_logged_stages(stderr: str, source, checkpoint) -> None:
    """stderr is a pipe here, as in a log: each stage says when it starts, then one line per tenth of it."""
    lines = stderr.splitlines()
    assert lines[0] == f"downloading 5 files, {format_bytes(sum(_sizes(source)))}, to {source}", stderr
    percents = [int(re.match(r"downloading: (\d+)% \(", line)[1]) for line in lines if line.startswith("downloading: ")]
    assert percents == sorted(set(percents)) and percents[-1] == 100 and 3 <= len(percents) <= 10, stderr
    quantizing = lines.index(f"quantizing into {checkpoint}: 3 files")  # 2 layers and the tables
    rest = [re.sub(r" on the [CG]PU:", " on the device:", line) for line in lines[quantizing + 1:]]
    assert rest == [f"quantizing {TINY_MODEL} on the device: layer_001.safetensors (1/3, 33%)",
                    f"quantizing {TINY_MODEL} on the device: embeddings.safetensors (2/3, 66%)",
                    f"quantizing {TINY_MODEL} on the device: done (3/3, 100%)",
                    f"registering {TINY_MODEL}"], stderr


def _sizes(folder):
    return [p.stat().st_size for p in folder.iterdir() if p.is_file() and p.name != STATE_FILE]


def test_get_again_only_registers_the_finished_checkpoint(run_cli, hub, home, tiny_catalog):
    get = ("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", hub.url)
    assert run_cli(*get).returncode == 0
    assert not (home / "data" / "downloads" / f"{TINY_NAME}.hf").exists()  # the source is deleted by default
    hub.log.clear()
    again = run_cli(*get)
    assert again.returncode == 0, again.stderr
    assert f"{TINY_MODEL} (default)" in again.stdout
    assert hub.log == []  # nothing downloaded, nothing quantized: registered again


def test_get_refuses_a_name_registered_to_another_model_before_downloading(run_cli, hub, home, tiny_catalog,
                                                                         tiny_qwen_dir):
    assert run_cli("models", "add", TINY_MODEL, str(tiny_qwen_dir)).returncode == 0
    get = ("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", hub.url)
    refused = run_cli(*get)
    assert_one_line_error(refused, f"a model named {TINY_MODEL!r} is already registered", "--replace")
    assert hub.log == [] and not (home / "data" / "downloads").exists()  # nothing fetched for a refusal
    assert registered_models()[TINY_MODEL] == str(tiny_qwen_dir)
    replaced = run_cli(*get, "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert registered_models()[TINY_MODEL] == str(home / "data" / "models" / TINY_MODEL)


def test_get_goes_through_the_system_proxy(hub, home, tiny_catalog):
    """HTTP_PROXY (what urllib's getproxies reads, with the Windows registry / macOS settings) carries
    every request; the hub's host name does not even resolve without it."""
    env = cli_env(home, HF_ENDPOINT="http://hub.invalid", HTTP_PROXY=hub.url)
    got = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", env=env)
    assert got.returncode == 0, got.stderr
    assert hub.log and all(r["proxied"] for r in hub.log)


def test_get_from_modelscope(hub, home, tiny_catalog, tiny_hub_model, monkeypatch):
    env = cli_env(home, MODELSCOPE_ENDPOINT=hub.url)
    got = qwen_tray("models", "get", TINY_NAME, "--source", "modelscope", "--method", "rtn", "--keep-source", env=env)
    assert got.returncode == 0, got.stderr
    source = home / "data" / "downloads" / f"{TINY_NAME}.modelscope"
    assert filecmp.cmp(source / "model.safetensors", tiny_hub_model / "model.safetensors", shallow=False)
    assert hub.requests_for(f"/api/v1/models/{TINY_REPO}/repo/files")
    assert not hub.requests_for("/resolve/")  # nothing from the other source
    assert (source / STATE_FILE).is_file()


def test_the_fake_hub_speaks_what_huggingface_hubs_own_download_expects(hub, tmp_path, tiny_hub_model):
    """The fake answers huggingface_hub's own snapshot_download (HEAD with ETag / X-Repo-Commit /
    X-Linked-*, the CDN redirect, model info) with the real files: what the tests above rely on."""
    from huggingface_hub import snapshot_download

    folder = snapshot_download(TINY_REPO, local_dir=tmp_path / "snap", endpoint=hub.url,
                               allow_patterns=["*.json", "*.safetensors"])
    for name in ("config.json", "tokenizer.json", WEIGHTS):
        assert filecmp.cmp(f"{folder}/{name}", tiny_hub_model / name, shallow=False), name
    assert hub.requests_for("/resolve/") and any(r["method"] == "HEAD" for r in hub.log)


WEIGHTS = "model.safetensors"
