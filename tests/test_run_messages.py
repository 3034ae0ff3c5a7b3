"""The messages for a --checkpoint / --resume that does not point where the user thinks: eval.py on a
folder that is not a run, on a run still training and on a run that stopped before exporting
weights; train.py --resume with a path that does not exist. Each is one line and exit 2."""
import os

from common import rundir
from common.runlock import RunLock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = """\
model: {name: resmlp_tiny}
data: {dataset: builtin10, image_size: 16, batch_size: 16, builtin_train_size: 32, builtin_val_size: 16,
       num_workers: 0}
optim: {epochs: 1}
train: {progress: false, log_with: none, mixed_precision: "no"}
"""


def _stopped_run(tmp_path, steps=(4, 8)):
    """A run directory as train.py leaves it before the first export: config, logs, checkpoints."""
    run = tmp_path / "run"
    for step in steps:
        (run / rundir.CHECKPOINTS / rundir.checkpoint_name(step)).mkdir(parents=True)
    (run / "config.yaml").write_text(TINY)
    (run / "metrics.jsonl").write_text("")
    return run


def test_eval_on_a_folder_that_is_not_a_run(tmp_path, one_line_error):
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "cat.jpg").write_bytes(b"")
    line = one_line_error("eval", ["--checkpoint", str(tmp_path / "photos")])
    assert "is not a train.py run directory" in line and "give a run directory" in line
    assert "resume" not in line


def test_eval_on_a_run_still_training(tmp_path, one_line_error):
    run = _stopped_run(tmp_path)
    lock = RunLock(str(run), purpose="training")
    lock.acquire()
    try:  # held by this (live) test process, as a training process would hold it
        line = one_line_error("eval", ["--checkpoint", str(run)])
    finally:
        lock.release()
    assert "is still training" in line and f"pid {os.getpid()}" in line and "wait for" in line
    newest = os.path.join(str(run), rundir.CHECKPOINTS, rundir.checkpoint_name(8), "model.safetensors")
    assert f"--checkpoint {newest} --config {os.path.join(str(run), 'config.yaml')}" in line


def test_eval_on_a_stopped_run_without_weights(tmp_path, one_line_error):
    run = _stopped_run(tmp_path)
    line = one_line_error("eval", ["--checkpoint", str(run)])
    assert "stopped before exporting weights" in line and "still training" not in line
    assert f"python train.py --config {os.path.join(str(run), 'config.yaml')} --resume auto" in line


def test_train_resume_from_a_missing_path_lists_the_checkpoints(tmp_path, one_line_error):
    run = _stopped_run(tmp_path)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(TINY)
    line = one_line_error("train", ["--config", str(cfg), f"train.output_dir={run}",
                            "--resume", str(run / rundir.CHECKPOINTS / "step_12")])
    assert "no such checkpoint" in line
    assert f"{rundir.checkpoint_name(4)}, {rundir.checkpoint_name(8)} (newest last)" in line and "--resume auto" in line
