"""`qwen-tray models get` run again, against the loopback fake hub: a checkpoint made another way
(--method, a recipe file edited since) is refused in one line unless --force; a resumed
quantization says so and counts from the finished files; a wrong --recipe is the user's, not the
catalog's; a refused download leaves no folder behind; --endpoint with another scheme."""

from __future__ import annotations

import argparse
import json
import threading

import pytest
from hub_support import TINY_MODEL, TINY_NAME, TINY_REPO, registered_models

from app.hub.catalog import find_entry
from app.hub.cli import endpoint_url
from app.hub.job import GetModelJob
from app.hub.progress import QUANTIZING, JobCancelled
from tests.conftest import assert_one_line_error


def _manifest(home, name: str = TINY_MODEL) -> dict:
    return json.loads((home / "data" / "models" / name / "manifest.json").read_text())


def test_get_with_another_method_refuses_the_existing_checkpoint_unless_force(run_cli, hub, home, tiny_catalog):
    get = ("models", "get", TINY_NAME, "--endpoint", hub.url)
    assert run_cli(*get, "--method", "rtn").returncode == 0
    hub.log.clear()
    refused = run_cli(*get, "--method", "search")
    checkpoint = home / "data" / "models" / TINY_MODEL
    assert_one_line_error(refused, str(checkpoint), "made with --method rtn", "(asked: --method search)", "--force",
                          "or --method rtn to use it as it is")
    assert "registering" not in refused.stderr and hub.log == []  # nothing fetched, nothing registered anew
    assert _manifest(home)["method"] == "rtn"
    forced = run_cli(*get, "--method", "search", "--force")
    assert forced.returncode == 0, forced.stderr
    assert _manifest(home)["method"] == "search" and registered_models()[TINY_MODEL] == str(checkpoint)
    again = run_cli(*get, "--method", "search")  # the same request as the checkpoint: registered again
    assert again.returncode == 0, again.stderr
    assert _manifest(home)["method"] == "search"


def test_get_with_an_edited_recipe_file_refuses_the_old_checkpoint(run_cli, hub, home, tiny_catalog, tmp_path):
    recipe = tmp_path / "careful.toml"
    recipe.write_text('base = "w4"\n')
    get = ("models", "get", TINY_NAME, "--endpoint", hub.url, "--method", "rtn", "--recipe", str(recipe))
    assert run_cli(*get).returncode == 0
    name = f"{TINY_NAME}-careful"
    recipe.write_text('default_bits = 3\n[bits]\n"lm_head" = 4\n')
    refused = run_cli(*get)
    assert_one_line_error(refused, "made with recipe 'careful' of other rules", f"(asked: {recipe} as it reads now)",
                          "--force")
    assert _manifest(home, name)["recipe"]["default_bits"] == 16
    assert run_cli(*get, "--force").returncode == 0
    assert _manifest(home, name)["recipe"]["default_bits"] == 3


def test_a_resumed_get_says_so_and_counts_from_the_finished_layers(run_cli, hub, home, tiny_catalog):
    cancel = threading.Event()
    seen = []

    def report(progress):
        seen.append(progress)
        if progress.stage == QUANTIZING and progress.done >= 1:  # layer_000 is finished and in the journal
            cancel.set()

    job = GetModelJob(find_entry(TINY_NAME), method="rtn", endpoint=hub.url)
    with pytest.raises(JobCancelled):
        job.run(report, cancel)
    again = run_cli("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", hub.url)
    assert again.returncode == 0, again.stderr
    lines = again.stderr.splitlines()
    start = lines.index("resuming: 1 of 3 files are already done")
    assert lines[start + 1] == f"quantizing into {job.out}: 3 files"
    # layer_000 is not counted again: the next line is the next tenth of the work actually done
    assert [line.replace(" on the GPU:", " on the CPU:") for line in lines[start + 2:]] == [
        f"quantizing {TINY_MODEL} on the CPU: embeddings.safetensors (2/3, 66%)",
        f"quantizing {TINY_MODEL} on the CPU: done (3/3, 100%)",
        f"registering {TINY_MODEL}"], again.stderr
    assert lines.count("resuming: 1 of 3 files are already done") == 1


def test_a_resumed_get_measures_its_rate_from_this_runs_work(hub, home, tiny_catalog):
    cancel = threading.Event()
    job = GetModelJob(find_entry(TINY_NAME), method="rtn", endpoint=hub.url)
    with pytest.raises(JobCancelled):
        job.run(lambda p: cancel.set() if p.stage == QUANTIZING and p.done >= 1 else None, cancel)
    seen = []
    job.run(seen.append)
    quantizing = [p for p in seen if p.stage == QUANTIZING]
    assert quantizing[0].notice == "resuming: 1 of 3 files are already done"
    assert (quantizing[0].done, quantizing[0].total, quantizing[0].rate) == (1, 3, None)
    assert [p.done for p in quantizing[1:]] == [1, 2, 3]


def test_an_unfinished_quantization_of_another_method_is_refused_and_force_resumes_one_made_as_asked(
        run_cli, hub, home, tiny_catalog):
    cancel = threading.Event()
    job = GetModelJob(find_entry(TINY_NAME), method="rtn", endpoint=hub.url)
    with pytest.raises(JobCancelled):
        job.run(lambda p: cancel.set() if p.stage == QUANTIZING and p.done >= 1 else None, cancel)
    get = ("models", "get", TINY_NAME, "--endpoint", hub.url)
    assert_one_line_error(run_cli(*get, "--method", "search"), "holds an unfinished quantization",
                          "made with --method rtn (asked: --method search)", "--force", "or --method rtn to resume it")
    # --force redoes only what was made another way: the same command run again after an
    # interruption still resumes
    forced = run_cli(*get, "--method", "rtn", "--force")
    assert forced.returncode == 0, forced.stderr
    assert "resuming: 1 of 3 files are already done" in forced.stderr.splitlines()
    assert _manifest(home)["method"] == "rtn"


def test_a_wrong_recipe_is_named_as_the_recipe_not_the_catalog_entry(run_cli, hub, home, tiny_catalog):
    got = run_cli("models", "get", TINY_NAME, "--endpoint", hub.url, "--recipe", "w3")
    assert_one_line_error(got, "recipe 'w3': not a built-in recipe (w4, mixed, q4) and no such file")
    assert "catalog" not in got.stderr
    assert hub.log == [] and not (home / "data" / "downloads").exists()  # said before anything is fetched


class _ListedButMissing(dict):
    """A repository whose listing names config.json (the first file fetched) but whose resolve
    answers 404 for it: a refusal of the download's first file."""

    def get(self, path, default=None):
        return default if path == "config.json" else super().get(path, default)


@pytest.mark.parametrize("refusal", ["gated", "404"])
def test_a_download_refused_before_its_first_byte_leaves_no_folder(run_cli, hub, home, tiny_catalog, refusal):
    if refusal == "gated":
        hub.gated.add(TINY_REPO)  # 401 for the first file
    else:
        hub.repos[TINY_REPO] = _ListedButMissing(hub.repos[TINY_REPO])
    got = run_cli("models", "get", TINY_NAME, "--method", "rtn", "--endpoint", hub.url)
    assert got.returncode == 1 and "kept" not in got.stderr
    assert hub.requests_for("/resolve/")  # the hub was asked for a file, and refused it
    downloads = home / "data" / "downloads"
    assert not (downloads / f"{TINY_NAME}.hf").exists(), list(downloads.rglob("*"))
    assert TINY_MODEL not in registered_models()


def test_an_endpoint_of_another_scheme_is_not_offered_a_broken_url(home, capsys):
    from app.cli import main

    with pytest.raises(SystemExit) as exit_:  # argparse refuses it, as it parses
        main(["models", "get", TINY_NAME, "--endpoint", "ftp://x"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "'ftp://x' must be an http(s) URL, such as https://hf-mirror.com" in err
    assert "https://ftp://" not in err and "needs https://" not in err
    with pytest.raises(argparse.ArgumentTypeError, match=r"needs https:// in front \(e.g. https://hf-mirror.com\)"):
        endpoint_url("hf-mirror.com")  # a bare host keeps its suggestion
    assert endpoint_url(" http://127.0.0.1:8000 ") == "http://127.0.0.1:8000"


def test_an_endpoint_typed_with_full_width_punctuation_is_read_as_ascii():
    """A Chinese input method types "：" and "／"; they are not a reason to refuse the URL."""
    assert endpoint_url("https：//hf-mirror.com") == "https://hf-mirror.com"
    assert endpoint_url("https：／／hf-mirror.com／") == "https://hf-mirror.com/"
    with pytest.raises(argparse.ArgumentTypeError, match=r"'ftp：//x' must be an http\(s\) URL"):
        endpoint_url("ftp：//x")
