"""On a GPU: the job quantizes right after the download on the GPU, and the tray would run the
result with the CUDA kernels (run through the device tool: pytest -m gpu tests/hub)."""

from __future__ import annotations

import pytest
from hub_support import catalog_toml
from fake_hub import FakeHub

from app.engine.cuda.fit import GPU, Machine
from app.hub.catalog import find_entry
from app.hub.job import GetModelJob
from app.quant.device import quantize_device
from app.hub.progress import QUANTIZING

pytestmark = pytest.mark.gpu
REPO, NAME = "tiny-org/Tiny-Qwen2-hd64", "Tiny-Qwen2-hd64"


@pytest.fixture
def kernel_hub(tmp_path_factory, qwen_tokenizer_dir, home):
    """A tiny model with shapes the CUDA kernels take (head_dim 64), published on a fake hub."""
    from tests.conftest import build_tiny_model

    model = build_tiny_model(tmp_path_factory.mktemp("hd64"), qwen_tokenizer_dir, "qwen2", hidden_size=256,
                             intermediate_size=384, tie_word_embeddings=True)
    (home / "config").mkdir(parents=True)
    (home / "config" / "catalog.toml").write_text(catalog_toml(model, name=NAME, repo=REPO))
    hub = FakeHub()
    hub.add_repo(REPO, model)
    hub.start()
    yield hub
    hub.stop()


def test_the_job_quantizes_on_the_gpu_and_the_tray_runs_it_there(kernel_hub):
    assert quantize_device() == "cuda"
    seen = []
    job = GetModelJob(find_entry(NAME), endpoint=kernel_hub.url, machine=Machine.detect())
    got = job.run(seen.append)
    details = {p.detail for p in seen if p.stage == QUANTIZING}
    assert details and all("on the GPU" in d for d in details)
    assert got.name == f"{NAME}-w4" and got.fit is not None and got.fit.where == GPU, got.fit
