#!/bin/bash
# Multi-node training on SLURM with `accelerate launch` (one launcher per node, 8 GPUs each).
#
#   sbatch scripts/slurm_train.sh                                    # ResMLP-S12, paper recipe
#   CONFIG=configs/imagenet/resmlp_s24.yaml sbatch --nodes 4 scripts/slurm_train.sh head.name=entmax15
#
# Global batch = data.batch_size (per GPU) x GPUs x train.grad_accum, and the lr follows it by the
# linear rule (optim.lr x global_batch / optim.lr_base_batch): base.yaml's 256/GPU on 8 GPUs is the
# paper's 2048; on 2 nodes (16 GPUs) pass data.batch_size=128 to keep 2048, or keep 256 and let the
# lr scale to 1e-2. `--resume auto` makes the job restartable: a requeued or resubmitted job
# continues from the latest complete checkpoint of train.output_dir, bit-exactly where it stopped.
#
# Preemption / time limit (training/preemption.py):
#   1. SLURM sends USR1 to this batch shell GRACE seconds before the time limit (--signal=B:USR1@300).
#   2. The trap below signals the job step with `scancel --signal=USR1` (all steps, not the batch
#      shell), which reaches the training processes; each node's task also forwards it to the
#      children of its `accelerate launch` (by parent pid), in case the signal reached only the task.
#      The launcher starts with USR1 ignored (its torch elastic agent would otherwise die of it) and
#      the training processes install their own handler. Copies of one signal arriving together
#      count once (the guard's debounce).
#   3. The training processes agree on the signal at the next sync step (every train.log_every
#      updates), save a complete checkpoint and exit with 138 (USR1; 143 for SIGTERM, 130 for SIGINT);
#      `accelerate launch` then exits non-zero.
#   4. Only once the step has ended, i.e. after the save, the job is requeued; the new job resumes.
#   A second signal (2 s or more after the first) makes a training process exit at once without
#   saving (137).
#
# Grace period: sync wait + one save. With several processes the ranks agree every train.log_every
# updates (50 in configs/imagenet: about 15 s at ~0.3 s per S12 update on 8 GPUs; one process checks
# after every update). An S12 checkpoint is 246 MB (weights, EMA, LAMB state); train.py's save
# (write, fsync, sha256, atomic rename) measured 1.1 s on a shared 2-core CPU machine's local disk; on
# GPUs add the device-to-host copy (~0.1 s) and the filesystem's write speed (1-3 s for 246 MB on a
# network filesystem). A signal that arrives during an evaluation waits for it to end (ImageNet val:
# tens of seconds). 300 s leaves a wide margin for all of these.
#SBATCH --job-name=resmlp
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one `accelerate launch` per node; it spawns one process per GPU
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=64           # data loading workers (data.num_workers per GPU process)
#SBATCH --time=72:00:00
#SBATCH --requeue
#SBATCH --signal=B:USR1@300
#SBATCH --output=slurm-%x-%j.out
set -euo pipefail

CONFIG=${CONFIG:-configs/imagenet/resmlp_s12.yaml}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
NUM_PROCESSES=$((SLURM_NNODES * GPUS_PER_NODE))

cd "${SLURM_SUBMIT_DIR:-$(dirname "$0")/..}"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export NCCL_ASYNC_ERROR_HANDLING=1
# If SIGTERM reaches the launcher (scancel, the time limit itself), its torch elastic agent forwards
# it to the workers and SIGKILLs them after this many seconds (default 30): leave room for the save.
export PET_SHUTDOWN_TIMEOUT=${PET_SHUTDOWN_TIMEOUT:-120}

# One node's task: the launcher starts with USR1 ignored (inherited), then this shell forwards USR1,
# TERM and INT to the launcher's direct children (the training processes) and keeps waiting for the
# launcher to exit, across the `wait`s the traps interrupt: if this shell died of the signal, SLURM
# would end the step and kill the training mid-save.
NODE_TASK='
trap "" USR1
accelerate launch --machine_rank "$SLURM_NODEID" "$@" &
LAUNCHER=$!
TRAPPED=0
for SIG in USR1 TERM INT; do
  trap "TRAPPED=1; pkill -$SIG -P $LAUNCHER || true" $SIG
done
while :; do
  TRAPPED=0
  wait "$LAUNCHER" && STATUS=0 || STATUS=$?
  [ "$TRAPPED" = 1 ] && kill -0 "$LAUNCHER" 2>/dev/null || break
done
exit "$STATUS"
'

PREEMPTED=0
TRAPPED=0
on_usr1() {
  PREEMPTED=1
  TRAPPED=1
  echo "time limit near: asking the training of job $SLURM_JOB_ID to save a checkpoint and stop"
  scancel --signal=USR1 "$SLURM_JOB_ID" || true   # every job step, not this batch shell
}
trap on_usr1 USR1
# SIGTERM (scancel, preemption by another job, the time limit): the step's processes get it too and
# save; this shell only keeps waiting for them (no requeue: SLURM decides on its own requeues then).
trap 'TRAPPED=1' TERM

srun --kill-on-bad-exit=1 bash -c "$NODE_TASK" node-task \
  --multi_gpu \
  --num_machines "$SLURM_NNODES" \
  --num_processes "$NUM_PROCESSES" \
  --main_process_ip "$MASTER_ADDR" \
  --main_process_port "$MASTER_PORT" \
  --rdzv_backend c10d \
  --same_network \
  train.py --config "$CONFIG" --resume auto "$@" &
STEP=$!

# `wait` returns early when the USR1 trap runs: keep waiting until the step (and its save) is over.
while :; do
  TRAPPED=0
  wait "$STEP" && STATUS=0 || STATUS=$?
  [ "$TRAPPED" = 1 ] && kill -0 "$STEP" 2>/dev/null || break
done

if [ "$PREEMPTED" = 1 ] && [ "$STATUS" != 0 ]; then
  echo "training stopped (exit $STATUS) after its checkpoint: requeueing $SLURM_JOB_ID"
  scontrol requeue "$SLURM_JOB_ID"
fi
exit "$STATUS"
