"""The processes of the commands that only run a model (eval.py, predict.py,
scripts/extract_features.py): how they are set up and how they end.

- `inference_accelerator()`: Accelerate on the GPU, or with `cpu=True` when there is no CUDA, which
  is what makes `accelerate launch --num_processes N` a gloo MULTI_CPU group (without it every
  process silently runs alone on the whole split).
- `finished(accelerator)`: every rank destroys the process group before its command returns
  (Accelerate's `end_training`). A rank that leaves it to the interpreter's teardown can abort
  ("terminate called without an active exception", SIGABRT) while gloo's threads still hold
  tensors, and the launcher then reports the whole command failed. Called on the normal path only:
  after an exception another rank may still be inside a collective, and destroying the group under
  it would hang it.
"""
import torch
from accelerate import Accelerator


def inference_accelerator():
    return Accelerator(cpu=not torch.cuda.is_available())


def finished(accelerator):
    """Destroy the process group (a no-op with one process)."""
    accelerator.end_training()
