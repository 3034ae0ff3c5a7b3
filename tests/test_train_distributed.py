"""Two real processes (`accelerate launch --multi_gpu --num_processes 2`, gloo on CPU) give the
same weights, to fp32 rounding, as one process with the same global batch (augmentation off), and
exact eval counts on a split that does not divide evenly."""
import subprocess
import sys

from test_train_helpers import (
    NO_AUG,
    ROOT,
    TRAIN_PY,
    read_metrics,
    run_inprocess,
    subprocess_env,
    tiny_cfg,
    weights,
    write_cfg,
)


def test_two_processes_match_one_process(tmp_path):
    # a learned entmax alpha: a parameter used by the loss outside forward(), which DDP must still sync
    common = [*NO_AUG, "optim.epochs=1", "data.builtin_val_size=101", "data.eval_batch_size=16",
              "head.name=entmax_bisect", "head.learn_alpha=true"]
    one = tiny_cfg(str(tmp_path / "one"), *common, "data.batch_size=32")
    two = tiny_cfg(str(tmp_path / "two"), *common, "data.batch_size=16")  # x 2 processes = 32
    assert run_inprocess(one) == 0  # the one-process reference needs no process of its own
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0",
           TRAIN_PY, "--config", write_cfg(two, tmp_path / "two.yaml")]
    p2 = subprocess.run(cmd, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert p2.stdout.count("done:") == 1  # one main process prints; the other rank is silent
    w1, w2 = weights(str(tmp_path / "one")), weights(str(tmp_path / "two"))
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-5
    m1, m2 = read_metrics(str(tmp_path / "one")), read_metrics(str(tmp_path / "two"))
    assert [r["step"] for r in m1 if r["kind"] == "train"] == [r["step"] for r in m2 if r["kind"] == "train"] == \
        list(range(1, 9))
    e1 = [r for r in m1 if r["kind"] == "eval"]
    e2 = [r for r in m2 if r["kind"] == "eval"]
    assert [r["n"] for r in e2] == [r["n"] for r in e1] == [101, 101]  # exact counts, no padding
    for a, b in zip(e1, e2):
        assert abs(a["top1"] - b["top1"]) <= 1 / 101 and abs(a["loss"] - b["loss"]) < 1e-4
