"""The catalog as a new user meets it: user entries the quantizer accepts are planned (padded K),
one bad user entry never hides the built-in ones nor keeps Settings from opening, and the sizes
are the hub's (or the config's dtype) in one unit."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.engine.cuda.fit import Machine
from app.engine.cuda.memory import RTX_3050_LAPTOP
from app.hub.catalog import load_catalog
from app.hub.plan import plan_entry
from app.ui.controllers.model_jobs import ModelJobs
from app.ui.i18n import set_language
from app.ui.preferences import PreferencesStore
from app.ui.widgets.catalog_page import CatalogPage

# SmolLM2-135M-Instruct's config.json: hidden size 576, not a multiple of 128
SMOLLM2 = """[[model]]
name = "SmolLM2-135M-Instruct"
recipe = "w4"
hf = { repo = "HuggingFaceTB/SmolLM2-135M-Instruct" }

[model.config]
architectures = ["LlamaForCausalLM"]
hidden_size = 576
intermediate_size = 1536
num_attention_heads = 9
num_key_value_heads = 3
num_hidden_layers = 30
vocab_size = 49152
tie_word_embeddings = true
torch_dtype = "bfloat16"
"""


def user_catalog(home: Path, text: str) -> Path:
    path = home / "config" / "catalog.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def page_rows(qtbot) -> tuple[CatalogPage, dict[str, list[str]]]:
    set_language("en")
    page = CatalogPage(ModelJobs(machine=lambda: Machine(RTX_3050_LAPTOP, None)), PreferencesStore())
    qtbot.addWidget(page)
    rows = {page.table.item(r, 0).text(): [page.table.item(r, c).text() for c in range(page.table.columnCount())]
            for r in range(page.table.rowCount())}
    return page, rows


def test_a_model_whose_hidden_size_is_not_a_multiple_of_128_is_listed(run_cli, home):
    user_catalog(home, SMOLLM2)
    got = run_cli("models", "catalog")
    assert got.returncode == 0, got.stderr
    assert "SmolLM2-135M-Instruct  (recipe w4; download " in got.stdout
    plan = plan_entry(load_catalog()[-1])
    assert plan.checkpoint_bytes < plan.download_bytes  # 4-bit with K padded 576 -> 640


def test_settings_lists_it_and_opens_whatever_one_entry_says(qtbot, home):
    user_catalog(home, SMOLLM2 + SMOLLM2.replace("SmolLM2-135M-Instruct", "Broken", 1)
                 .replace("hidden_size = 576", 'hidden_size = "576"'))
    _, rows = page_rows(qtbot)
    assert rows["SmolLM2-135M-Instruct"][2] != "?" and rows["SmolLM2-135M-Instruct"][4] == "Fits the GPU"
    assert rows["Broken"][2:4] == ["?", "?"]
    assert rows["Broken"][4].startswith("catalog entry Broken: cannot plan its sizes")
    assert rows["Qwen2.5-3B-Instruct"][4] == "Fits the GPU"


@pytest.mark.parametrize("text, fragment", [('[[model]]\nname = "X"\n', "model 'X': needs [hf] or [modelscope]"),
                                            ('[[model]\nname = "X"\n', "invalid TOML")])
def test_a_bad_user_entry_is_named_above_the_table_and_the_built_in_ones_stay(qtbot, home, text, fragment):
    path = user_catalog(home, text)
    page, rows = page_rows(qtbot)
    assert page.problems.isVisibleTo(page) and page.problems.text().startswith(str(path))
    assert fragment in page.problems.text() and "skipped" in page.problems.text()
    assert {"Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct", "Qwen2.5-1.5B-Instruct"} <= set(rows)
    page.select("Qwen2.5-3B-Instruct")
    assert page.table.currentRow() >= 0 and not page.error.text()


def test_sizes_are_in_one_unit_and_the_same_in_settings_and_the_cli(qtbot, run_cli, home):
    user_catalog(home, SMOLLM2)  # a small model (~0.3 GB) beside 15 GB ones
    _, rows = page_rows(qtbot)
    out = run_cli("models", "catalog").stdout
    for name, cells in rows.items():
        assert cells[2].endswith(" GB") and cells[3].endswith(" GB"), cells
        assert f"{name}  (recipe {cells[1]}; download {cells[2]}, checkpoint {cells[3]})" in out
    assert rows["SmolLM2-135M-Instruct"][2] == "0.3 GB"


def test_the_planned_download_is_the_weights_in_the_configs_dtype(home, tiny_catalog, tiny_hub_model):
    """The tiny model is stored in float32: 4 bytes a weight, not the 2 of a bfloat16 model."""
    from app.hub.catalog import find_entry

    entry = find_entry("Tiny-Qwen2")
    assert entry.spec.torch_dtype == "float32"  # (newer transformers write it as "dtype")
    weights = sum(p.stat().st_size for p in tiny_hub_model.glob("*.safetensors"))
    planned = plan_entry(entry).download_bytes
    assert planned <= weights < planned + (64 << 10)  # the files are the tensors plus a small JSON header
