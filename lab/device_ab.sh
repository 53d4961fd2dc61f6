#!/usr/bin/env bash
# A candidate tree against a base tree on the device (docs/history/kernels/phase-23.md): the candidate's
# GPU tests (SM90 and as SM86 PTX), then the decode step of both trees in interleaved rounds.
#   here:          bash lab/device_ab.sh prepare BASE_REF    (the base's files into .device/base;
#                  also run `bash lab/device_check.sh prepare` once for the tests' packages)
#   on the device: bash lab/device_ab.sh tests COMMIT        (carry .device/site.tar.xz)
#                  bash lab/device_ab.sh step COMMIT BASE_COMMIT   (carry .device/base)
#                  bash lab/device_ab.sh proxy COMMIT BASE_COMMIT  (the 3050 proxy of both trees)
#                  bash lab/device_ab.sh timeline COMMIT            (the candidate's step, kernel by kernel)
# Logs and JSON land under $OUT. Each mode fits one call (10 minutes); both in one call only when
# the machine is already warm: `tests` takes ~4 minutes, `step` ~6 (not measured: set STEP_TIMEOUT).
set -o pipefail
cd "$(dirname "$0")/.."
GPU_TESTS="tests/test_argmax.py tests/test_cuda_runtime.py tests/test_greedy_pipeline.py tests/test_cuda_prefill.py
 tests/test_kernels_gpu.py tests/test_fused_norm.py tests/test_fused_rope.py tests/test_device_sampling.py
 tests/test_programmatic.py tests/test_kernel_arch.py tests/test_gemv_preload.py tests/test_reference_fit.py
 tests/test_doctor.py tests/test_token_draw.py tests/test_lookup.py"
SM86_TESTS="tests/test_kernels_gpu.py tests/test_fused_norm.py tests/test_fused_rope.py tests/test_cuda_runtime.py"
case "${1:-}" in
prepare)
    ref=${2:?usage: $0 prepare BASE_REF}
    grep -qx "/.device/" .git/info/exclude 2>/dev/null || echo "/.device/" >> .git/info/exclude
    rm -rf .device/base && mkdir -p .device/base
    git archive "$ref" app benchmarks lab pyproject.toml | tar -x -C .device/base
    git rev-parse "$ref" > .device/base/COMMIT
    du -sh .device/base ;;
tests)
    bash lab/device_check.sh stage
    export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/devsite NCCL_NVLS_ENABLE=0
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/log.txt"
    # shellcheck disable=SC2086  # word splitting of the test lists is intended
    timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu $GPU_TESTS -q -rfE -p no:cacheprovider \
        -k "not starter" 2>&1 | tee "$OUT/tests_sm90.txt" | tail -15
    # shellcheck disable=SC2086
    QWEN_TRAY_TEST_KERNEL_ARCH=86 timeout "${TEST_TIMEOUT:-300}" python3 -m pytest -m gpu $SM86_TESTS -q -rfE \
        -p no:cacheprovider -k "not starter" 2>&1 | tee "$OUT/tests_sm86.txt" | tail -15 ;;
step)
    # The graph-only step of both trees, interleaved (a drift between them shows as a spread); in
    # round 1 the candidate also with CANDIDATE_VARIANTS (ablate_step.py variants, e.g. phase 23's
    # norm_prologue_20mib,no_x_prefetch; the base tree runs `full` only).
    commit=${2:-unknown} base_commit=${3:-$(cat .device/base/COMMIT 2>/dev/null || echo unknown)}
    export PYTHONUNBUFFERED=1
    nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/log.txt"
    for round in 1 2; do
        for tree in base candidate; do
            dir=$([ $tree = base ] && echo .device/base || echo .)
            c=$([ $tree = base ] && echo "$base_commit" || echo "$commit")
            variants=full
            [ $tree = candidate ] && [ $round = 1 ] && variants=full${CANDIDATE_VARIANTS:+,$CANDIDATE_VARIANTS}
            (cd "$dir" && timeout "${STEP_TIMEOUT:-200}" python3 -m lab.ablate_step --variants "$variants" \
                --commit "$c" --out "$OUT/step_${tree}_${round}.json") 2>&1 | tail -3 | tee -a "$OUT/log.txt"
        done
    done ;;
timeline)
    # Where the candidate's step goes, kernel by kernel (exposed µs per role).
    export PYTHONUNBUFFERED=1
    timeout "${TIMELINE_TIMEOUT:-200}" python3 -m lab.probe_step_timeline --commit "${2:-unknown}" \
        --out "$OUT/step_timeline_h200.json" 2>&1 | tail -30 | tee "$OUT/log.txt" ;;
proxy)
    # The RTX 3050's code path and grids on 16 held SMs (probe_3050_proxy.py), base then candidate.
    commit=${2:-unknown} base_commit=${3:-$(cat .device/base/COMMIT 2>/dev/null || echo unknown)}
    export PYTHONUNBUFFERED=1
    (cd .device/base && timeout "${PROXY_TIMEOUT:-200}" python3 -m benchmarks.probe_3050_proxy --commit "$base_commit" \
        --out "$OUT/proxy_3050_base.json") 2>&1 | tail -12 | tee "$OUT/proxy.txt"
    timeout "${PROXY_TIMEOUT:-200}" python3 -m benchmarks.probe_3050_proxy --commit "$commit" \
        --out "$OUT/proxy_3050_candidate.json" 2>&1 | tail -12 | tee -a "$OUT/proxy.txt" ;;
*)
    echo "usage: $0 prepare BASE_REF | tests COMMIT | step COMMIT BASE_COMMIT | proxy COMMIT BASE_COMMIT | timeline COMMIT" >&2
    exit 2 ;;
esac
