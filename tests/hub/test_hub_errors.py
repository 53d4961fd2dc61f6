"""What goes wrong while getting a model is one clear line, and nothing half-done is registered:
offline, a repo that is not there, a gated repo, a missing file, a truncated or corrupt file."""

from __future__ import annotations

import socket

import pytest
from hub_support import TINY_MODEL, TINY_NAME, TINY_REPO, catalog_toml, registered_models
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
    assert_one_line_error(got, f"cannot reach http://127.0.0.1:{port}", "ConnectError", "proxy", "mirror")
    assert "kept" not in got.stderr  # nothing was downloaded: nothing to keep
    _nothing_registered(home)


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


def test_a_broken_user_catalog_names_the_file_and_field(run_cli, home):
    path = home / "config" / "catalog.toml"
    path.parent.mkdir(parents=True)
    path.write_text('[[model]]\nname = "X"\nrecipe = "w5"\nhf = { repo = "a/b" }\n')
    assert_one_line_error(run_cli("models", "catalog"), str(path), "model 'X'", "w5")
    path.write_text('[[model]]\nname = "X"\nrecipe = "w4"\n')
    assert_one_line_error(run_cli("models", "catalog"), "needs [hf] or [modelscope]")


def test_a_repo_modelscope_does_not_have(run_cli, home, hub, tiny_hub_model, monkeypatch):
    (home / "config").mkdir(parents=True)
    (home / "config" / "catalog.toml").write_text(catalog_toml(tiny_hub_model, repo="tiny-org/Nope"))
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
    got = run_cli("models", "get", TINY_NAME, "--source", "modelscope", "--method", "rtn")
    assert_one_line_error(got, f"tiny-org/Nope (revision master) was not found on {hub.url}")
    _nothing_registered(home)
