"""A checkpoint file is hashed once per change: the verified-files cache (app.formats.verified)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from app.errors import ModelLoadError
from app.formats.checkpoint import open_checkpoint
from app.formats.recipe import load_recipe
from app.formats.verified import CACHE_FILE
from app.quant.quantizer import QuantizeJob, quantize_model

LAYER = "layer_001.safetensors"


@pytest.fixture(scope="module")
def source_checkpoint(tmp_path_factory, tiny_qwen_dir) -> Path:
    out = tmp_path_factory.mktemp("verified") / "tiny-w4"
    quantize_model(QuantizeJob(model=tiny_qwen_dir, out=out, recipe=load_recipe("w4"), method="rtn"))
    return out


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("QWEN_TRAY_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def checkpoint(tmp_path, source_checkpoint) -> Path:
    return Path(shutil.copytree(source_checkpoint, tmp_path / "ckpt"))


def flip_byte_keeping_size_and_mtime(path: Path) -> None:
    """Silent corruption: a changed byte that neither the size nor the mtime shows."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_a_verified_file_is_remembered_and_a_forced_check_still_hashes(home, checkpoint):
    manifest = open_checkpoint(checkpoint)
    cache = json.loads((home / "cache" / CACHE_FILE).read_text())
    for name, entry in manifest.files.items():
        size, _mtime, sha = cache[str((checkpoint / name).resolve())]
        assert (size, sha) == (entry.bytes, entry.sha256)
    # The hash is skipped while size and mtime match (the trade-off) ...
    flip_byte_keeping_size_and_mtime(checkpoint / LAYER)
    open_checkpoint(checkpoint)
    # ... and `checkpoint info --verify` (reuse_verified=False) hashes every file anyway.
    with pytest.raises(ModelLoadError, match="checksum mismatch") as err:
        open_checkpoint(checkpoint, reuse_verified=False)
    assert str(checkpoint / LAYER) in str(err.value)


def test_a_changed_file_is_hashed_again(home, checkpoint):
    open_checkpoint(checkpoint)
    path = checkpoint / LAYER
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x40
    path.write_bytes(bytes(data))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    with pytest.raises(ModelLoadError, match="checksum mismatch"):
        open_checkpoint(checkpoint)


def test_a_failed_check_is_not_remembered(home, checkpoint):
    flip_byte_keeping_size_and_mtime(checkpoint / LAYER)
    for _ in range(2):
        with pytest.raises(ModelLoadError, match="checksum mismatch"):
            open_checkpoint(checkpoint)


def test_a_broken_or_unwritable_cache_is_ignored(home, checkpoint):
    (home / "cache").mkdir(parents=True)
    (home / "cache" / CACHE_FILE).write_text("{not json")
    open_checkpoint(checkpoint)  # the unreadable cache is ignored, then replaced
    assert json.loads((home / "cache" / CACHE_FILE).read_text())
    shutil.rmtree(home / "cache")
    (home / "cache").write_text("a file where the cache folder should be")
    manifest = open_checkpoint(checkpoint)  # cannot remember: still loads
    assert manifest.files
