"""Where the commands a comparison starts lie: it runs train.py, eval.py and its job workers by path
(from any working directory), and names itself in its messages, its report and its SLURM script."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository root
TRAIN_SCRIPT = os.path.join(ROOT, "train.py")
EVAL_SCRIPT = os.path.join(ROOT, "eval.py")
WORKER_SCRIPT = os.path.join(ROOT, "scripts", "compare_worker.py")  # a --jobs slot's worker process
COMMAND = "python scripts/compare_heads.py"  # the comparison's command, as a user types it in the root
