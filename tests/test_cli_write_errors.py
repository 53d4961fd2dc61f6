"""A model folder that cannot be written (a folder without write permission, a name too long)
is one sentence naming the folder, why and what to do, never a traceback: `quantize`,
`models add-starter` and `models import-gguf`; and a weights file that cannot be read says why.
Permission cases run without root's override (tests/unprivileged.py); a full disk is
tests/test_disk_full.py."""

from __future__ import annotations

import os
import shutil

import pytest

from app.engine.gguf_import import find_starter_gguf
from app.settings.models import check_model_name
from tests.conftest import assert_one_line_error
from tests.unprivileged import run_cli_commands

posix_only = pytest.mark.skipif(os.name != "posix", reason="POSIX file permissions")


@posix_only
def test_quantize_into_a_folder_without_write_permission_is_one_sentence(tmp_path, tiny_qwen_dir):
    readonly = tmp_path / "rodir"
    readonly.mkdir()
    readonly.chmod(0o555)
    try:
        quantize, = run_cli_commands(tmp_path / "home", ["quantize", "--model", str(tiny_qwen_dir), "--recipe", "w4",
                                                         "--method", "rtn", "--out", str(readonly / "q")])
    finally:
        readonly.chmod(0o755)
    assert_one_line_error(quantize, f"cannot write the checkpoint {readonly / 'q'}: Permission denied; nothing was "
                                    f"finished: make {readonly} writable or choose another --out, then run the same "
                                    "quantization again")
    assert list(readonly.iterdir()) == []


@posix_only
def test_converting_into_a_models_folder_without_write_permission_is_one_sentence(tmp_path):
    home = tmp_path / "home"
    models = home / "data" / "models"
    models.mkdir(parents=True)
    models.chmod(0o555)
    try:
        starter, imported = run_cli_commands(home, ["models", "add-starter"],
                                             ["models", "import-gguf", str(find_starter_gguf()), "--name", "ro-imp"])
    finally:
        models.chmod(0o755)
    for proc, name in ((starter, "SmolLM2-135M-Instruct"), (imported, "ro-imp")):
        assert_one_line_error(proc, f"cannot convert {find_starter_gguf().name} into {models / name}: Permission "
                                    f"denied; nothing was written: make {models} writable or set QWEN_TRAY_HOME to a "
                                    "writable folder and try again")
    assert list(models.iterdir()) == []


def test_a_model_name_too_long_for_a_folder_is_refused_before_any_work(cli, tmp_path):
    proc = cli("models", "import-gguf", str(find_starter_gguf()), "--name", "n" * 250)
    assert_one_line_error(proc, f"model name {'n' * 20 + '…'!r} is too long (250 characters); use at most 100")
    assert not (tmp_path / "data" / "models").exists()  # refused before the conversion
    assert check_model_name(" " + "n" * 100 + " ") == "n" * 100 and check_model_name("模" * 66) == "模" * 66


@posix_only
def test_a_weights_file_without_read_permission_says_permission_denied(tmp_path, tiny_qwen_dir):
    model = tmp_path / "unread"
    shutil.copytree(tiny_qwen_dir, model)
    weights = model / "model.safetensors"
    weights.chmod(0)
    ask, quantize = run_cli_commands(tmp_path / "home", ["ask", "--model", str(model), "--device", "cpu", "hi"],
                                     ["quantize", "--model", str(model), "--recipe", "w4", "--method", "rtn",
                                      "--out", str(tmp_path / "q")])
    for proc in (ask, quantize):
        assert_one_line_error(proc, f"{weights}: cannot read safetensors file (Permission denied); check its "
                                    "permissions")
