#!/usr/bin/env bash
# Phase 21's probes in one device call (docs/history/kernels/phase-21.md): the stream shapes, the persistent MLP
# (with the records variant) and the persistent layer; JSON and logs under $OUT.
#   on the device:   bash lab/device_phase21.sh COMMIT
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1
commit=${1:-unknown}
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv | tee "$OUT/log.txt"
for probe in probe_ring_stream probe_persistent_mlp probe_persistent_layer; do
    echo "== $probe" | tee -a "$OUT/log.txt"
    timeout "${PROBE_TIMEOUT:-150}" python3 -m "lab.$probe" --commit "$commit" \
        --out "$OUT/${probe}_h200.json" 2>&1 | tee "$OUT/$probe.txt" | tail -40
done
