#!/usr/bin/env bash
# One-command GPU check for a machine with a CUDA GPU (offline, no pip install; < 9 minutes on
# one H100/H200). CI never needs it.
#
#   bash scripts/gpu_check.sh            # outputs under $GPU_CHECK_DIR (default: runs/gpu_check)
#
# 1. the CUDA tests (pytest -m cuda): every head on CUDA under torch.cuda.set_sync_debug_mode
#    ("error") against the CPU path, a bf16 training run, the in-memory loader on the device, and
#    train.py learning on CUDA as on the CPU (compiled or eager, in-memory or per-sample loader)
# 2. scripts/bench_gpu.py: ResMLP-S12/224 ours vs timm (eager and compiled, bf16, batch 256) with
#    MFU; every mapping and loss vs the entmax package and F.cross_entropy; the per-head step
#    overhead at 1000 classes; ~60 s of train.py under sync-debug "error" (steps/s)
# 3. the DALI step (scripts/gpu_check_dali.sh), skipped with a message when DALI is not installed
# The `entmax` package (benchmark oracle only) comes from scripts/wheels/ when it is not installed.
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
export PYTHON=$PY
OUT=${GPU_CHECK_DIR:-runs/gpu_check}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
if ! "$PY" -c "import entmax" 2>/dev/null; then
  for whl in scripts/wheels/*.whl; do export PYTHONPATH="$PWD/$whl${PYTHONPATH:+:$PYTHONPATH}"; done
fi

if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False)"; exit 1
fi
"$PY" -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)" | tee -a "$SUMMARY"

echo "== 1. pytest -m cuda"
timeout 300 "$PY" -m pytest -m cuda -q -p no:cacheprovider tests/test_cuda_heads.py tests/test_train.py \
  tests/test_data_loaders.py tests/test_cuda_learning.py 2>&1 | tail -25 | tee "$OUT/pytest.txt"
echo "pytest -m cuda: $(tail -1 "$OUT/pytest.txt")" >> "$SUMMARY"

echo "== 2. bench_gpu.py"
timeout 380 "$PY" scripts/bench_gpu.py --out "$OUT/bench" --train-seconds 45 2>&1 | tee "$OUT/bench_gpu.txt" | tail -30
sed -n '/==== bench_gpu/,$p' "$OUT/bench_gpu.txt" >> "$SUMMARY"
for f in heads step_overhead; do
  [ -f "$OUT/bench/$f.txt" ] && { echo "--- $f"; cat "$OUT/bench/$f.txt"; } >> "$SUMMARY"
done

echo "== 3. DALI"
timeout 150 bash scripts/gpu_check_dali.sh "$SUMMARY"

echo
echo "==================== gpu_check summary ($OUT)"
cat "$SUMMARY"
