"""Weights checked against the sha256 their run recorded (inference/weights_record.py): every command
that reads a run's weights (eval.py, predict.py, scripts/export.py in each format,
scripts/extract_features.py) refuses a changed file in one line naming both hashes and
--accept-changed-weights, and runs on it with that flag; a finished run, a run between its export and
its checkpoint, one resumed from an older checkpoint and a weights file without a record pass.

The run is the tiny comparison's finished softmax run (tests/test_compare.py), copied before any change."""
import hashlib
import importlib
import os
import shutil

import pytest
from PIL import Image

from common import rundir
from common.errors import UserError
from inference.trained_run import open_run
from inference.weights_record import ACCEPT_FLAG, recorded_sha256
from test_compare import tiny_run_dir
from test_train_helpers import reset_accelerate_state

LAST = rundir.checkpoint_name(6)  # the tiny run's last epoch end (2 epochs of 3 updates)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def flip_last_byte(path):
    """Change one byte of the tensor data: the file still parses, only its hash tells."""
    with open(path, "r+b") as f:
        f.seek(-1, os.SEEK_END)
        last = f.read(1)[0]
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last ^ 1]))


def copy_run(tmp_path, name="run"):
    run = tmp_path / name
    shutil.copytree(tiny_run_dir("softmax"), run)
    return str(run)


@pytest.fixture(scope="module")
def changed_run(tmp_path_factory):
    """A copy of the finished run whose model.safetensors had one byte changed: (run, its sha256, the record's)."""
    run = copy_run(tmp_path_factory.mktemp("changed"))
    weights = os.path.join(run, rundir.WEIGHTS)
    recorded = sha256(weights)
    flip_last_byte(weights)
    return run, sha256(weights), recorded


def image_list(tmp):
    path = os.path.join(tmp, "photo.png")
    Image.new("RGB", (40, 36), (90, 30, 200)).save(path)
    return path


# command -> (module, its arguments for RUN with scratch folder TMP)
COMMANDS = {
    "eval": ("eval", lambda run, tmp: ["--checkpoint", run, "--calib", "none", "--quiet"]),
    "predict": ("predict", lambda run, tmp: ["--checkpoint", run, "--images", image_list(tmp),
                                             "--output", os.path.join(tmp, "p.csv")]),
    "export-onnx": ("export", lambda run, tmp: [run, "--format", "onnx", "--output", os.path.join(tmp, "m.onnx")]),
    "export-torchscript": ("export", lambda run, tmp: [run, "--format", "torchscript",
                                                       "--output", os.path.join(tmp, "m.torchscript.pt")]),
    "extract_features": ("extract_features", lambda run, tmp: ["--checkpoint", run, "--splits", "val",
                                                               "--output", os.path.join(tmp, "features")]),
}


def test_a_finished_runs_weights_match_their_record():
    run = tiny_run_dir("softmax")
    for name in (rundir.WEIGHTS, rundir.EMA_WEIGHTS):
        record = recorded_sha256(os.path.join(run, name))
        # the last epoch end's checkpoint: the same bytes as the export
        assert record.marker == os.path.join(run, rundir.CHECKPOINTS, LAST, rundir.MARKER)
        assert record.sha256 == sha256(os.path.join(run, name)) and not record.own_checkpoint
    checkpoint = os.path.join(run, rundir.CHECKPOINTS, rundir.checkpoint_name(3))
    record = recorded_sha256(os.path.join(checkpoint, rundir.WEIGHTS))
    assert record.own_checkpoint and record.sha256 == sha256(os.path.join(checkpoint, rundir.WEIGHTS))
    for path, ema in ((run, False), (run, True), (checkpoint, False)):
        opened = open_run(path, ema=ema)
        opened.read_weights()  # checked, and passes
        assert opened.weights_sha256 == sha256(opened.weights)


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_changed_weights(command, changed_run, tmp_path, one_line_error):
    run, changed, recorded = changed_run
    module, args = COMMANDS[command]
    reset_accelerate_state()
    line = one_line_error(module, args(run, str(tmp_path)))
    assert f"has sha256 {changed}" in line and f"records {recorded}" in line and ACCEPT_FLAG in line
    assert f"restore it from {os.path.join(run, rundir.CHECKPOINTS, LAST, rundir.WEIGHTS)}" in line
    written = [os.path.join(folder, f) for folder, _, files in os.walk(tmp_path) for f in files]
    assert written == ([str(tmp_path / "photo.png")] if command == "predict" else [])  # nothing written


@pytest.mark.parametrize("command", COMMANDS)
def test_the_flag_uses_changed_weights_with_a_warning(command, changed_run, tmp_path, capsys):
    run, changed, _ = changed_run
    module, args = COMMANDS[command]
    reset_accelerate_state()
    assert importlib.import_module(module).main(args(run, str(tmp_path)) + [ACCEPT_FLAG]) in (0, None)
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert any(f"has sha256 {changed}" in w and f"({ACCEPT_FLAG})" in w for w in warnings), warnings


@pytest.mark.parametrize("module", ["eval", "predict", "export", "extract_features"])
def test_every_command_documents_the_flag(module, capsys):
    with pytest.raises(SystemExit):
        importlib.import_module(module).parse_args(["--help"])
    assert ACCEPT_FLAG in capsys.readouterr().out


def test_timm_export_refuses_changed_weights(tmp_path, one_line_error):
    """--format timm (a paper variant: timm has no resmlp_tiny), on a run with train.py's record of its weights."""
    from test_export_timm import make_run

    run, _ = make_run(tmp_path)
    recorded = record_as_trained(str(run), step=4)
    (run / rundir.SUMMARY).write_text("{}")  # its training finished (inference/run_status.py check_finished)
    flip_last_byte(str(run / rundir.WEIGHTS))
    line = one_line_error("export", [str(run), "--format", "timm"])
    assert f"records {recorded}" in line and ACCEPT_FLAG in line
    assert not [p for p in (run / "timm").rglob("*") if p.is_file()]  # nothing written (the folder is checked first)


def record_as_trained(run, step):
    """What train.py records at an epoch end: the epochs.csv row, then checkpoint step_N with a copy of
    the exported weights and its marker (only the files this check reads). -> the recorded sha256."""
    checkpoint = os.path.join(run, rundir.CHECKPOINTS, rundir.checkpoint_name(step))
    os.makedirs(checkpoint)
    shutil.copy(os.path.join(run, rundir.WEIGHTS), checkpoint)
    recorded = sha256(os.path.join(checkpoint, rundir.WEIGHTS))
    with open(os.path.join(run, rundir.EPOCHS), "w") as f:
        f.write(f"epoch,step\n1,{step}\n")
    with open(os.path.join(checkpoint, rundir.MARKER), "w") as f:
        f.write(f'{{"step": {step}, "files": {{}}, "sha256": {{"{rundir.WEIGHTS}": "{recorded}"}}}}')
    return recorded


# ------------------------------------------------------------------------------------------ no false refusal
def other_weights(path):
    """Valid weights that differ from the file's (another epoch's export)."""
    from safetensors.torch import load_file, save_file

    state = load_file(path)
    state["head.bias"] = state["head.bias"] + 1.0
    save_file(state, path)


def test_a_run_between_its_export_and_its_checkpoint_is_not_refused(tmp_path):
    """A run still training exports at an epoch end (after its epochs.csv row) and checkpoints right
    after; until then, or when that save failed, no record exists for the new export."""
    run = copy_run(tmp_path)
    with open(os.path.join(run, rundir.EPOCHS), "a") as f:
        f.write("3,9" + "," * 20 + "\n")  # epoch 3's row, step 9: its checkpoint is not written yet
    other_weights(os.path.join(run, rundir.WEIGHTS))
    assert recorded_sha256(os.path.join(run, rundir.WEIGHTS)) is None
    open_run(run).read_weights()


def test_a_run_whose_last_epoch_checkpoint_was_pruned_is_not_refused(tmp_path):
    """Stopped mid-epoch with train.keep_last: the checkpoint of the export's step is gone."""
    run = copy_run(tmp_path)
    shutil.rmtree(os.path.join(run, rundir.CHECKPOINTS, LAST))
    other_weights(os.path.join(run, rundir.WEIGHTS))
    open_run(run).read_weights()


def test_a_run_resumed_from_an_older_checkpoint_is_not_refused(tmp_path):
    """A resume from step 3 drops the later epochs.csv rows; the export is still step 6's until the run
    exports again: it matches that checkpoint's copy. A changed file is still refused."""
    run = copy_run(tmp_path)
    path = os.path.join(run, rundir.EPOCHS)
    with open(path) as f:
        lines = f.read().splitlines()
    with open(path, "w") as f:
        f.write("\n".join(lines[:2]) + "\n")  # the header and epoch 1 (step 3)
    weights = os.path.join(run, rundir.WEIGHTS)
    assert recorded_sha256(weights).marker.endswith(os.path.join(rundir.checkpoint_name(3), rundir.MARKER))
    open_run(run).read_weights()
    flip_last_byte(weights)
    with pytest.raises(UserError, match=ACCEPT_FLAG):
        open_run(run).read_weights()


def test_weights_without_a_record_are_not_checked(tmp_path):
    bare = tmp_path / "w.safetensors"  # a downloaded or hand-made file: nothing recorded its hash
    shutil.copy(os.path.join(tiny_run_dir("softmax"), rundir.WEIGHTS), bare)
    flip_last_byte(str(bare))
    assert recorded_sha256(str(bare)) is None
    open_run(str(bare), config=os.path.join(tiny_run_dir("softmax"), rundir.CONFIG)).read_weights()


def test_a_changed_checkpoint_file_is_refused(tmp_path):
    """A checkpoint's own weights, opened as the checkpoint or as a file: its marker is the record."""
    run = copy_run(tmp_path)
    checkpoint = os.path.join(run, rundir.CHECKPOINTS, LAST)
    weights = os.path.join(checkpoint, rundir.WEIGHTS)
    flip_last_byte(weights)
    for opened in (open_run(checkpoint), open_run(weights, config=os.path.join(run, rundir.CONFIG))):
        with pytest.raises(UserError) as err:
            opened.read_weights()
        line = str(err.value)
        assert "\n" not in line and f"has sha256 {sha256(weights)}" in line and ACCEPT_FLAG in line
        assert f"{os.path.join(checkpoint, rundir.MARKER)} records" in line
        assert "use another of the run's checkpoints" in line
