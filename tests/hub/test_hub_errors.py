"""What goes wrong while getting a model is one clear line, and nothing half-done is registered:
offline, a repo that is not there, a gated repo, a missing file, a truncated or corrupt file."""

from __future__ import annotations

import socket

import pytest
from hub_support import TINY_MODEL, TINY_NAME, TINY_REPO, catalog_toml, cli_env, qwen_tray, registered_models
from fake_hub import Faults

from tests.conftest import assert_error_after_progress, assert_one_line_error

WEIGHTS = "model.safetensors"


def _nothing_registered(home) -> None:
    assert TINY_MODEL not in registered_models()
    assert not (home / "data" / "models" / TINY_MODEL / "manifest.json").exists()


def _get(run_cli, endpoint: str, *extra: str):
    return run_cli("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", endpoint, *extra)


def test_an_unreachable_hub(run_cli, home, tiny_catalog):
    with socket.socket() as s:  # a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = _get(run_cli, f"http://127.0.0.1:{port}")
    # the mirror itself failed: check it, or go without it, or to the other source, in the CLI's words
    assert_one_line_error(got, f"cannot reach http://127.0.0.1:{port}", "ConnectError", "proxy",
                          "the mirror's URL (--endpoint or HF_ENDPOINT)", "--source modelscope")
    assert "Settings" not in got.stderr and "use a mirror" not in got.stderr
    assert "kept" not in got.stderr  # nothing was downloaded: nothing to keep
    _nothing_registered(home)
    got = _get(run_cli, f"http://127.0.0.1:{port}", "--source", "modelscope")
    assert_one_line_error(got, f"cannot reach http://127.0.0.1:{port}", "--endpoint or MODELSCOPE_ENDPOINT",
                          "--source hf")
    assert "HF_ENDPOINT" not in got.stderr and "Settings" not in got.stderr


def test_an_unreachable_official_hub_suggests_a_mirror_or_modelscope(home, tiny_catalog):
    with socket.socket() as s:  # the system proxy: a loopback port nobody listens on
        s.bind(("127.0.0.1", 0))
        proxy = f"http://127.0.0.1:{s.getsockname()[1]}"
    env = {k: v for k, v in cli_env(home, HTTPS_PROXY=proxy).items() if k not in ("HF_ENDPOINT", "MODELSCOPE_ENDPOINT")}
    got = qwen_tray("models", "get", TINY_NAME, "--method", "rtn", env=env, timeout=120)
    assert_one_line_error(got, "cannot reach https://huggingface.co", "use a mirror (--endpoint https://hf-mirror.com",
                          "--source modelscope")
    got = qwen_tray("models", "get", TINY_NAME, "--source", "modelscope", env=env, timeout=120)
    assert_one_line_error(got, "cannot reach https://www.modelscope.cn", "--source hf")
    assert "HF_ENDPOINT" not in got.stderr


def test_an_endpoint_without_its_scheme_is_refused_when_parsed(home, tiny_catalog):
    got = qwen_tray("models", "get", TINY_NAME, "--endpoint", "hf-mirror.com", env=cli_env(home), timeout=120)
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert "'hf-mirror.com' needs https:// in front (e.g. https://hf-mirror.com)" in got.stderr


def test_a_repo_that_is_not_there(run_cli, home, hub, tiny_hub_model):
    (home / "config").mkdir(parents=True)
    (home / "config" / "catalog.toml").write_text(catalog_toml(tiny_hub_model, repo="tiny-org/Nope"))
    got = _get(run_cli, hub.url)
    assert_one_line_error(got, f"tiny-org/Nope was not found on {hub.url}", "hf auth login")
    _nothing_registered(home)


def test_a_gated_repo(run_cli, home, hub, tiny_catalog):
    hub.gated.add(TINY_REPO)  # whatever token this machine has, it is not the one granted access
    got = _get(run_cli, hub.url)
    assert_one_line_error(got, f"{TINY_REPO} is gated on {hub.url}", "accept its terms", "HF_TOKEN")
    _nothing_registered(home)


def test_a_file_the_listing_names_but_the_hub_lacks(run_cli, home, hub, tiny_catalog):
    del hub.repos[TINY_REPO]["tokenizer.json"]
    got = _get(run_cli, hub.url)
    assert_one_line_error(got, f"{TINY_REPO} on {hub.url} has no tokenizer.json")
    _nothing_registered(home)


def test_a_truncated_file(run_cli, home, hub, tiny_catalog):
    hub.faults[WEIGHTS] = Faults(truncate=1 << 20)
    got = _get(run_cli, hub.url)  # (the small files came first: the download had started)
    assert_error_after_progress(got, f"sent {WEIGHTS} of {TINY_REPO} with another size than its listing's")
    source = home / "data" / "downloads" / f"{TINY_NAME}.hf"
    assert not (source / (WEIGHTS + ".part")).exists() and not (source / WEIGHTS).exists()
    _nothing_registered(home)


def test_a_corrupt_file_is_deleted_and_fetched_anew(run_cli, home, hub, tiny_catalog):
    hub.faults[WEIGHTS] = Faults(corrupt=True)
    got = _get(run_cli, hub.url)
    assert_error_after_progress(got, f"{WEIGHTS} of {TINY_REPO} from {hub.url} does not match its checksum",
                                "it was deleted")
    source = home / "data" / "downloads" / f"{TINY_NAME}.hf"
    assert not (source / (WEIGHTS + ".part")).exists() and not (source / WEIGHTS).exists()
    _nothing_registered(home)
    hub.faults.clear()
    assert _get(run_cli, hub.url).returncode == 0
    assert TINY_MODEL in registered_models()


@pytest.mark.parametrize("name, fragment", [("Qwen2.5-9B", "no model named 'Qwen2.5-9B' in the catalog")])
def test_an_unknown_catalog_name(run_cli, home, name, fragment):
    assert_one_line_error(run_cli("models", "get", name), fragment, "Qwen2.5-3B-Instruct")


@pytest.mark.parametrize("text, fragments", [
    ('[[model]]\nname = "X"\nrecipe = "w5"\nhf = { repo = "a/b" }\n', ("model 'X'", "w5", "the entry is skipped")),
    ('[[model]]\nname = "X"\n', ("model 'X'", "needs [hf] or [modelscope]", "the entry is skipped")),
    ('[[model]]\nname = "X"\nhf = { repo = "a/b" }\n', ("'recipe' must be a non-empty string", "skipped")),
    ('[[model]\nname = "X"\n', ("invalid TOML", "its entries are skipped")),
])
def test_a_broken_user_catalog_entry_is_named_and_the_built_in_ones_still_work(run_cli, home, text, fragments):
    path = home / "config" / "catalog.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text + '\n' if "[[model]\n" in text else text + catalog_good_entry())
    got = run_cli("models", "catalog")
    assert got.returncode == 0
    warnings = [line for line in got.stderr.splitlines() if line.startswith("qwen-tray: warning: ")]
    assert len(warnings) == 1 and str(path) in warnings[0], got.stderr
    assert all(f in warnings[0] for f in fragments), warnings[0]
    assert "Qwen2.5-3B-Instruct  (recipe w4; download " in got.stdout
    if "[[model]\n" not in text:  # the good entry beside the bad one is listed too
        assert "Good  (recipe w4" in got.stdout
    with socket.socket() as s:  # `models get` of a built-in entry goes as far as the network
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = run_cli("models", "get", "Qwen2.5-3B-Instruct", "--endpoint", f"http://127.0.0.1:{port}")
    assert got.stderr.startswith("qwen-tray: warning: ") and f"cannot reach http://127.0.0.1:{port}" in got.stderr


def catalog_good_entry() -> str:
    return '\n[[model]]\nname = "Good"\nrecipe = "w4"\nhf = { repo = "a/good" }\n'


def test_a_repo_modelscope_does_not_have(run_cli, home, hub, tiny_hub_model, monkeypatch):
    (home / "config").mkdir(parents=True)
    (home / "config" / "catalog.toml").write_text(catalog_toml(tiny_hub_model, repo="tiny-org/Nope"))
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
    got = run_cli("models", "get", TINY_NAME, "--source", "modelscope", "--method", "rtn")
    assert_one_line_error(got, f"tiny-org/Nope (revision master) was not found on {hub.url}")
    _nothing_registered(home)


@pytest.mark.parametrize("source", ["hf", "modelscope"])
def test_a_hub_that_accepts_the_connection_but_never_answers(run_cli, home, tiny_catalog, monkeypatch, source):
    """A proxy or mirror that hangs: the listing gives up after HF_HUB_ETAG_TIMEOUT seconds."""
    monkeypatch.setenv("HF_HUB_ETAG_TIMEOUT", "0.5")
    with socket.socket() as silent:  # the kernel completes the handshake; nobody ever reads or answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        got = _get(run_cli, url, "--source", source)
    assert_one_line_error(got, f"cannot reach {url}", "Timeout", "HF_HUB_ETAG_TIMEOUT")
    _nothing_registered(home)
