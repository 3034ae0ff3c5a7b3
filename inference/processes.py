"""The processes of the commands that only run a model (eval.py, predict.py,
scripts/extract_features.py): how they are set up.

`inference_accelerator(command)`: Accelerate on the GPU, or with `cpu=True` when there is no CUDA,
which is what makes `accelerate launch --multi_gpu --num_processes N` a gloo MULTI_CPU group
(without it every process silently runs alone on the whole split); and the warning train.py gives
when `accelerate launch --num_processes N` without --multi_gpu started one process.

How they end: every rank calls `accelerator.end_training()` (destroys the process group) before its
command returns. A rank that leaves it to the interpreter's teardown can abort ("terminate called
without an active exception", SIGABRT) while gloo's threads still hold tensors, and the launcher
then reports the whole command failed. On the normal path only: after an exception another rank
may still be inside a collective, and destroying the group under it would hang it.
"""
import sys

import torch
from accelerate import Accelerator

from training.launch import single_process_warning


def inference_accelerator(command):
    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    warning = single_process_warning(accelerator.num_processes, command=command)
    if warning and accelerator.is_main_process:
        print(warning, file=sys.stderr, flush=True)
    return accelerator
