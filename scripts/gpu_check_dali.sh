#!/usr/bin/env bash
# DALI step of the GPU check; scripts/gpu_check.sh can call it, or run it alone:
#
#   bash scripts/gpu_check_dali.sh [SUMMARY_FILE]      # ~1-2 minutes, no network
#
# 1. the DALI tests, including the CUDA one (GPU pipeline vs CPU pipeline), if DALI is installed
# 2. DALI-GPU loader img/s at 224 px (decode + RRC + flip + RandAugment m9 mstd0.5 + erasing,
#    batch 256, 6 DALI + 2 reader threads) and loader img/s / ResMLP-S12 bf16 train img/s
#    (targets: >= 10,000 img/s and >= 1.5). Skipped with a message when DALI is not installed.
# Lines for the summary are appended to SUMMARY_FILE when given.
set -uo pipefail
cd "$(dirname "$0")/.."
SUMMARY=${1:-/dev/null}
PY=${PYTHON:-python3}
WORK=$(mktemp -d -t resmlp-dali-check-XXXX)
trap 'rm -rf "$WORK"' EXIT
if ! "$PY" -c "import nvidia.dali" 2>/dev/null; then
  echo "dali: SKIPPED (NVIDIA DALI not installed; pip install -r requirements-dali.txt where the index is reachable)" \
    | tee -a "$SUMMARY"
  exit 0
fi
echo "== DALI tests (CPU pipelines + the CUDA one)"
timeout 300 "$PY" -m pytest tests/test_dali.py -q -p no:cacheprovider 2>&1 | tail -3 | tee "$WORK/pytest.txt"
echo "dali tests: $(tail -1 "$WORK/pytest.txt")" >> "$SUMMARY"
echo "== DALI-GPU loader vs ResMLP-S12 training"
timeout 300 "$PY" scripts/bench_data.py --dali-gpu --quick 2>&1 | tee "$WORK/bench.txt"
grep "^dali-gpu" "$WORK/bench.txt" >> "$SUMMARY" || echo "dali-gpu: FAILED (see output above)" >> "$SUMMARY"
