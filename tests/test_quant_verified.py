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
from app.formats.verified import CACHE_FILE, SAMPLE_BYTES, VerifiedFiles, sample_offsets, sampled_sha256
from app.quant.quantizer import QuantizeJob, quantize_model
from tests.conftest import assert_one_line_error

LAYER = "layer_001.safetensors"
EMBEDDINGS = "embeddings.safetensors"


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


def flip_byte_keeping_size_and_mtime(path: Path, offset: int = -100) -> None:
    """Silent corruption: a byte changed in place, the modification time put back (os.utime)."""
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x40
    path.write_bytes(bytes(data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_size, path.stat().st_mtime_ns) == (st.st_size, st.st_mtime_ns)


def cache_entries(home: Path) -> dict:
    return json.loads((home / "cache" / CACHE_FILE).read_text())


def test_a_verified_file_is_remembered_with_its_stamp(home, checkpoint):
    manifest = open_checkpoint(checkpoint)
    cache = cache_entries(home)
    for name, entry in manifest.files.items():
        path = checkpoint / name
        remembered = cache[str(path.resolve())]
        assert remembered == {**VerifiedFiles.stamp(path), "sha256": entry.sha256}
        assert remembered["size"] == entry.bytes and remembered["inode"] == path.stat().st_ino


@pytest.mark.parametrize("where", ["in a sampled block", "between the sampled blocks"])
def test_bytes_flipped_in_place_with_the_mtime_restored_are_caught_at_the_next_load(home, checkpoint, where):
    """The size and the mtime match, so the old cache (size + mtime) skipped the hash: the
    status-change time and the sampled blocks do not match."""
    open_checkpoint(checkpoint)  # verified and remembered
    path = checkpoint / EMBEDDINGS  # 20 MB: most of it lies between the sampled blocks
    size = path.stat().st_size
    offset = size - 100 if where == "in a sampled block" else size // 2 + SAMPLE_BYTES // 2
    assert any(o <= offset < o + SAMPLE_BYTES for o in sample_offsets(size)) == (where == "in a sampled block")
    flip_byte_keeping_size_and_mtime(path, offset)
    with pytest.raises(ModelLoadError, match="checksum mismatch") as err:
        open_checkpoint(checkpoint)
    assert str(path) in str(err.value) and "\n" not in str(err.value)


def test_the_sampled_blocks_catch_a_change_the_stat_does_not_show(home, checkpoint):
    """Where an in-place write leaves the stat as it was (Windows: its "ctime" is the creation
    time), a change in a sampled block still brings the hash back. Simulated by giving the
    cache the corrupted file's stat with the good file's sample."""
    open_checkpoint(checkpoint)
    path = checkpoint / LAYER
    good = cache_entries(home)[str(path.resolve())]
    flip_byte_keeping_size_and_mtime(path)  # 44 KB: the samples cover all of it
    stat_now = {k: v for k, v in VerifiedFiles.stamp(path).items() if k != "sample"}
    assert VerifiedFiles.stamp(path)["sample"] != good["sample"]
    write_cache_entry(home, path, {**good, **stat_now})
    with pytest.raises(ModelLoadError, match="checksum mismatch"):
        open_checkpoint(checkpoint)


def write_cache_entry(home: Path, path: Path, entry: dict) -> None:
    entries = cache_entries(home)
    entries[str(path.resolve())] = entry
    (home / "cache" / CACHE_FILE).write_text(json.dumps(entries))


def test_a_forced_check_hashes_files_the_cache_vouches_for(checkpoint, cli, tmp_path):
    """``--verify`` (ask, serve, checkpoint info) hashes every file whatever the cache says:
    here the cache is made to vouch for a corrupted file, which a plain load then trusts."""
    home = tmp_path  # the cli fixture's QWEN_TRAY_HOME
    open_checkpoint(checkpoint)
    path = checkpoint / LAYER
    flip_byte_keeping_size_and_mtime(path)
    sha256 = cache_entries(home)[str(path.resolve())]["sha256"]
    write_cache_entry(home, path, {**VerifiedFiles.stamp(path), "sha256": sha256})
    open_checkpoint(checkpoint)  # trusted: the stamp matches what the cache says
    ask = ("ask", "--model", str(checkpoint), "--device", "cpu", "--max-tokens", "2", "hi")
    assert cli(*ask).returncode == 0
    assert_one_line_error(cli(*ask, "--verify"), str(path), "checksum mismatch")
    serve = cli("serve", "--model", str(checkpoint), "--device", "cpu", "--port", "0", "--verify")
    # serve says where it listens first, then the load fails: one error line after it
    assert serve.returncode != 0 and "Traceback" not in serve.stderr
    assert serve.stderr.strip().splitlines()[-1] == f"qwen-tray: error: {path}: sha256 checksum mismatch " \
                                                    "(the file is corrupt or was changed after quantization)"
    assert_one_line_error(cli("checkpoint", "info", str(checkpoint), "--verify"), str(path), "checksum mismatch")


def test_ask_names_a_file_flipped_in_place(checkpoint, cli):
    """What the user sees: after a good load, a byte flipped with the mtime restored is a
    one-line error naming the file at the next ``ask``."""
    ask = ("ask", "--model", str(checkpoint), "--device", "cpu", "--max-tokens", "2", "hi")
    assert cli(*ask).returncode == 0  # verified and remembered
    flip_byte_keeping_size_and_mtime(checkpoint / LAYER)
    assert_one_line_error(cli(*ask), str(checkpoint / LAYER), "checksum mismatch")


def test_sampled_blocks_lie_at_the_start_the_end_and_between(tmp_path):
    assert sample_offsets(10) == [0]
    size = 10 * SAMPLE_BYTES
    assert sample_offsets(size) == [0, 3 * SAMPLE_BYTES, 6 * SAMPLE_BYTES, 9 * SAMPLE_BYTES]
    file = tmp_path / "f"
    file.write_bytes(bytes(size))
    before = sampled_sha256(file, size)
    flip_byte_keeping_size_and_mtime(file, 3 * SAMPLE_BYTES + 7)
    assert sampled_sha256(file, size) != before
    flip_byte_keeping_size_and_mtime(file, 3 * SAMPLE_BYTES + 7)  # back
    flip_byte_keeping_size_and_mtime(file, 2 * SAMPLE_BYTES)  # between two blocks: only the stat shows it
    assert sampled_sha256(file, size) == before


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
