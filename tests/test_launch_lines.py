"""The run's first log lines say what the launch gave it: processes, precision, data backend, and a
warning when `accelerate launch --num_processes N` (N > 1) silently started one process, or when
TensorBoard logging was asked for but cannot happen."""
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from data import explain_backend
from test_train_helpers import ROOT, TRAIN_PY, subprocess_env, tiny_cfg, write_cfg
from training.launch import busy_cores_warning, launch_lines, precision_line, single_process_warning

# What `accelerate launch --num_processes 2` without --multi_gpu leaves a single process (simple launcher).
ASKED_TWO_GOT_ONE = {"ACCELERATE_MIXED_PRECISION": "no", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_single_process_warning_only_when_several_were_asked_for():
    assert "--multi_gpu" in single_process_warning(1, ASKED_TWO_GOT_ONE)
    assert single_process_warning(2, {**ASKED_TWO_GOT_ONE, "WORLD_SIZE": "2"}) is None
    assert single_process_warning(1, {"ACCELERATE_MIXED_PRECISION": "no"}) is None  # plain accelerate launch
    assert single_process_warning(1, {}) is None  # python train.py


def test_precision_line_explains_the_launchers_contradicting_notice():
    line = precision_line("bf16", "bf16", {"ACCELERATE_MIXED_PRECISION": "no"})
    assert line.startswith("precision: bf16") and "does not apply" in line
    assert "does not apply" not in precision_line("bf16", "bf16", {"ACCELERATE_MIXED_PRECISION": "bf16"})
    assert "does not apply" not in precision_line("no", "no", {})


def test_backend_reason_for_each_auto_outcome():
    cfg = SimpleNamespace(backend="auto", dataset="builtin10")
    backend, why = explain_backend(cfg, "cpu")
    assert backend == "pil" and "not 'builtin10'" in why
    cfg.dataset = "imagefolder"
    if not torch.cuda.is_available():
        backend, why = explain_backend(cfg, "cpu")
        assert backend == "pil" and "no CUDA device" in why
    cfg.backend = "pil"
    assert explain_backend(cfg, "cpu") == ("pil", "data.backend=pil")


def test_busy_cores_warning_only_on_busy_cores_at_default_threads():
    line = busy_cores_warning("cpu", threads=2, load=5.3, cores=2, env={})
    assert line.startswith("warning: the machine is already busy (load 5.3 on 2 cores) and torch uses 2 threads")
    assert line.endswith("start it with OMP_NUM_THREADS=1") and "\n" not in line
    assert busy_cores_warning("cpu", threads=2, load=1.9, cores=2, env={}) is None  # not busy
    assert busy_cores_warning("cpu", threads=2, load=5.3, cores=2, env={"OMP_NUM_THREADS": "2"}) is None  # chosen
    assert busy_cores_warning("cpu", threads=1, load=5.3, cores=2, env={}) is None  # one thread already
    assert busy_cores_warning("cuda", threads=2, load=5.3, cores=2, env={}) is None  # the GPU does the work


def test_lines_list_every_warning():
    lines = launch_lines(num_processes=1, device=torch.device("cpu"), configured_precision="bf16",
                         used_precision="bf16", backend="pil", backend_why="data.backend=pil", env=ASKED_TWO_GOT_ONE)
    assert lines[0].startswith("launch: 1 process(es) on cpu; precision: bf16")
    assert lines[1] == "data backend: pil (data.backend=pil)"
    assert any("--multi_gpu" in line for line in lines)


def test_accelerate_launch_without_multi_gpu_warns(tmp_path):
    cfg = tiny_cfg(str(tmp_path / "run"), "optim.epochs=1", "data.builtin_train_size=64", "data.batch_size=32")
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--num_machines", "1",
           "--mixed_precision", "no", "--dynamo_backend", "no", TRAIN_PY, "--config",
           write_cfg(cfg, tmp_path / "c.yaml")]
    p = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "started one" in p.stdout and "--multi_gpu" in p.stdout
    assert "launch: 1 process(es) on cpu" in p.stdout


def test_the_loading_line_only_on_a_terminal_and_once_per_launch():
    import io

    from common.startup import say_loading

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    tty, pipe, rank1 = Terminal(), io.StringIO(), Terminal()
    say_loading("train.py", tty, env={})
    say_loading("train.py", pipe, env={})
    say_loading("train.py", rank1, env={"LOCAL_RANK": "1"})
    assert tty.getvalue() == "train.py: loading torch, timm and Accelerate (a few seconds)...\n"
    assert pipe.getvalue() == rank1.getvalue() == ""


@pytest.mark.parametrize("command", ["eval.py", "predict.py", "scripts/extract_features.py"])
def test_every_multi_process_command_warns_when_it_got_one_process(command, monkeypatch, capsys):
    """`accelerate launch --num_processes 2 eval.py` without --multi_gpu starts one process: the
    inference commands say so as train.py does, naming themselves in the fix."""
    from inference.processes import inference_accelerator

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setenv("MASTER_PORT", "29500")  # set by the launcher when asked for several processes
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    accelerator = inference_accelerator(command)
    err = capsys.readouterr().err
    assert accelerator.num_processes == 1 and err.count("\n") == 1
    assert "asked for several processes but started one" in err and f"--num_processes N {command}" in err
    monkeypatch.delenv("MASTER_PORT")  # a plain single-process start: no warning
    inference_accelerator(command)
    assert capsys.readouterr().err == ""
