#!/usr/bin/env bash
# One-command GPU check (<= 5 minutes, no network) for a machine with a CUDA GPU. CI never needs it.
#
#   bash scripts/gpu_check.sh            # prints a compact summary at the end
#
# 1. the CUDA-marked tests (pytest -m cuda)
# 2. a short bf16 training run per head (softmax, sparsemax, entmax15, entmax_bisect) with img/s
# 3. the same run with a compiled model (train.compile=true)
# 4. the per-head training-step benchmark at 1000 classes (bf16)
# Everything runs offline on the built-in dataset; outputs go to $GPU_CHECK_DIR (default: a temp dir).
set -uo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
OUT=${GPU_CHECK_DIR:-$(mktemp -d -t resmlp-gpu-check-XXXX)}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"

if ! python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False)"; exit 1
fi
python -c "import torch; print('gpu_check:', torch.cuda.get_device_name(0), 'torch', torch.__version__)" | tee -a "$SUMMARY"

# A GPU-sized short run: CIFAR-size ResMLP-S12 on 20k built-in images, one epoch.
RUN_ARGS="model.name=resmlp_cifar_s12 data.batch_size=256 data.eval_batch_size=1000 data.builtin_train_size=20000 \
  optim.epochs=1 optim.warmup_epochs=0.2 optim.lr_base_batch=256 train.mixed_precision=bf16 train.progress=false \
  train.save_every=100000 train.tensorboard=false"

echo "== 1. pytest -m cuda"
timeout 120 python -m pytest -m cuda -q -p no:cacheprovider 2>&1 | tail -5 | tee "$OUT/pytest.txt"
echo "pytest -m cuda: $(tail -1 "$OUT/pytest.txt")" >> "$SUMMARY"

report() {  # report NAME RUN_DIR EXIT_CODE
  python - "$1" "$2" "$3" >> "$SUMMARY" <<'PY'
import json, os, sys
name, run, rc = sys.argv[1], sys.argv[2], sys.argv[3]
path = os.path.join(run, "summary.json")
if rc != "0" or not os.path.exists(path):
    print(f"{name:<22} FAILED (exit {rc}, see {run}.log)")
else:
    s = json.load(open(path))
    raw = s["final"].get("raw", {})
    print(f"{name:<22} {s['img_per_s']:>9.0f} img/s  top1 {100 * raw.get('top1', float('nan')):5.1f}%  "
          f"support {raw.get('support_size', float('nan')):5.2f}  {s['train_time_s']:.0f}s")
PY
}

echo "== 2. bf16 training run per head"
for head in softmax sparsemax entmax15 entmax_bisect; do
  timeout 60 python train.py --config configs/quickstart.yaml $RUN_ARGS head.name=$head \
    train.output_dir="$OUT/$head" --overwrite > "$OUT/$head.log" 2>&1
  report "bf16 $head" "$OUT/$head" $?
done

echo "== 3. compiled model (train.compile=true)"
timeout 120 python train.py --config configs/quickstart.yaml $RUN_ARGS head.name=entmax15 train.compile=true \
  train.output_dir="$OUT/compiled" --overwrite > "$OUT/compiled.log" 2>&1
report "bf16 entmax15 compiled" "$OUT/compiled" $?

echo "== 4. per-head step benchmark (1000 classes, bf16)"
timeout 60 python scripts/bench_train_heads.py --device cuda --bf16 --quick --batch-size 256 \
  model.name=resmlp_cifar_s12 2>&1 | tee "$OUT/bench.txt" | tail -6
tail -5 "$OUT/bench.txt" >> "$SUMMARY"

echo
echo "==================== gpu_check summary ($OUT)"
cat "$SUMMARY"
