"""A --jobs slot's worker process of scripts/compare_heads.py, started by path
(comparison/worker_slots.py): it serves the slot's train.py and eval.py steps (comparison/worker.py)."""
import sys

import _root  # noqa: F401  (the repository root on sys.path: scripts/_root.py)

from comparison.worker import main

if __name__ == "__main__":
    sys.exit(main())
