# The SLURM array job `scripts/compare_heads.py --emit-slurm FILE` writes, as a template: comparison/slurm.py
# fills it with str.format ({name} is a field, {{ and }} stand for literal braces) and leaves out these
# lines before the shebang. The fields: the comparison's stem and command lines, the run count, the
# repository, the config, one case per planned run, and what the evaluation check is asked.
#!/bin/bash
# Head comparison {stem}: a SLURM array job, one task per planned run ({n} runs), written by
#   {command}
# Submit it from anywhere (each task works in the repository): sbatch {script}
# A task trains its run with scripts/slurm_train.sh (accelerate launch per node, --resume auto; near the
# time limit it checkpoints and requeues the task) and then evaluates it with eval.py. Finished work
# is skipped, so a requeued or resubmitted task continues where it stopped. Defaults: one node with
# GPUS_PER_NODE GPUs per run (sbatch --nodes / --gpus-per-node and GPUS_PER_NODE=... change them;
# keep the global batch: see scripts/slurm_train.sh). When the tasks are done:
#   {report_command}
#SBATCH --job-name=compare-{stem}
#SBATCH --array=0-{last}
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=1          # one `accelerate launch` per node; it spawns one process per GPU
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64
#SBATCH --time=72:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%A_%a.out
set -euo pipefail

REPO={repo}   # relative paths of the plan (run directories, data roots) are relative to it
CONFIG={config}
export GPUS_PER_NODE=${{GPUS_PER_NODE:-8}}
TASK=${{SLURM_ARRAY_TASK_ID:?submit this script with sbatch: it is an array job}}

case "$TASK" in
{cases}
  *) echo "no run for array task $TASK (this script plans {n}: 0-{last})"; exit 1;;
esac
cd "$REPO"

if [ ! -f "$RUN_DIR/summary.json" ]; then
  # scripts/slurm_train.sh runs in the background so that this batch shell can pass the time-limit
  # signal (USR1, --signal=B:...) on to it; it then checkpoints, requeues the task and exits non-zero.
  CONFIG="$CONFIG" SLURM_SUBMIT_DIR="$REPO" bash "$REPO/scripts/slurm_train.sh" "${{TRAIN_OVERRIDES[@]}}" &
  TRAIN=$!
  TRAPPED=0
  trap 'TRAPPED=1; kill -USR1 "$TRAIN" 2>/dev/null || true' USR1
  trap 'TRAPPED=1' TERM
  while :; do
    TRAPPED=0
    wait "$TRAIN" && STATUS=0 || STATUS=$?
    [ "$TRAPPED" = 1 ] && kill -0 "$TRAIN" 2>/dev/null || break
  done
  [ "$STATUS" = 0 ] || exit "$STATUS"   # preempted (requeued by slurm_train.sh) or failed
fi

if ! python "$REPO/scripts/compare_heads.py" --check-evaluated "$RUN_DIR" {eval_file} {ood_check}; then
  if [ "$GPUS_PER_NODE" -gt 1 ]; then
    EVAL_LAUNCH=(accelerate launch --multi_gpu --num_machines 1 --num_processes "$GPUS_PER_NODE")
  else
    EVAL_LAUNCH=(python)
  fi
  srun --nodes=1 --ntasks=1 "${{EVAL_LAUNCH[@]}}" "$REPO/eval.py" "${{EVAL_ARGS[@]}}"
fi
