"""The quantization methods a user can name, and the default (no torch here: ``qwen-tray --help``
and the hub's job settings read them without importing the quantizer)."""

# gptq is the default: with its settings (app.quant.quantizer.GPTQ_SETTINGS) it reads better than
# calibrated on held-out text at 4 bits, in mixed and with 3-bit attention (docs/results/quality.md,
# "The default method"; docs/results/gptq_study.md).
METHOD_CHOICES = ("gptq", "calibrated", "search", "rtn", "awq")
DEFAULT_METHOD = "gptq"
# `qwen-tray recipe sensitive` ranks units by one of these methods' own errors (app.quant.sensitivity).
SENSITIVITY_METHODS = ("gptq", "calibrated")
