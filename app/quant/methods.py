"""The quantization methods a user can name, and the default (no torch here: ``qwen-tray --help``
and the hub's job settings read them without importing the quantizer)."""

# gptq is the default: with its settings (app.quant.quantizer.GPTQ_SETTINGS) it reads better than
# calibrated on held-out text at 4 bits, in mixed and with 3-bit attention (docs/results/quality.md,
# "The default method"; docs/results/gptq_study.md).
METHOD_CHOICES = ("gptq", "calibrated", "search", "rtn", "awq")
DEFAULT_METHOD = "gptq"
