"""What a run reads from outside itself: model.pretrained, train.teacher, cached features.

- A run never reads from its own directory (training/run_sources.py), and docs/pretrained.md's commands
  that read a run, run as written against a tiny source run, leave every file of it unchanged.
- Cached features carry their identity (data.features_source_sha256 / features_settings_sha256):
  a resume or a comparison on features re-extracted at the same path is refused in one line.
- The sha256 recorded is that of the bytes loaded, even when the file is replaced right after it
  was read (a source run exporting while it trains).
- Messages: a malicious .pth, a missing pooling tensor, a changed pretrained file.

The source is one tiny quick-start run, trained here by the page's own command at
WORKSPACE/runs/quickstart, where the docs' commands expect it (WORKSPACE/configs links the
repository's configs). That every page's commands find what they read: tests/test_docs_chain.py."""
import builtins
import hashlib
import json
import os
import shutil
import sys

import pytest
import torch
import yaml
from PIL import Image
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from common.cli import run_cli
from common.errors import UserError
from markdown_docs import command_lines, shell_commands
from test_train_helpers import ROOT, reset_accelerate_state

sys.path.insert(0, os.path.join(ROOT, "scripts"))
pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# appended to every command: the same recipe, shrunk to a second (one update per epoch)
TINY_DATA = ["data.builtin_train_size=32", "data.builtin_val_size=16", "data.eval_batch_size=64"]
TINY = ["data.image_size=16", "data.batch_size=32", *TINY_DATA, "optim.epochs=1", "train.ema=false",
        "train.eval_every=1", "train.log_every=1", "train.save_every=1000", "train.progress=false",
        "train.log_with=none"]
QUICKSTART = "configs/quickstart.yaml"
SOURCE = "runs/quickstart"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder holding `configs` (a link) and the tiny source run at runs/quickstart, trained by
    docs/pretrained.md's command for it (the config's default train.output_dir)."""
    import configs
    import train

    def output_dir(argv):
        args = train.parse_args(argv)
        return configs.load_config(os.path.join(ROOT, args.config), args.overrides).train.output_dir

    makes_source = [c for c in docs_commands("pretrained.md") if c[0] == "train.py" and output_dir(c[1:]) == SOURCE]
    assert makes_source == [["train.py", "--config", QUICKSTART]]
    root = tmp_path_factory.mktemp("workspace")
    os.symlink(os.path.join(ROOT, "configs"), root / "configs")
    here = os.getcwd()
    os.chdir(root)
    try:
        assert _train(makes_source[0][1:] + TINY) == 0
    finally:
        os.chdir(here)
    return root


def _train(argv):
    import train

    reset_accelerate_state()
    return train.main(argv)


def _extract(argv):
    import extract_features

    reset_accelerate_state()
    return extract_features.main(argv)


def _one_line(call):
    with pytest.raises(UserError) as err:
        call()
    text = str(err.value)
    assert text and "\n" not in text
    return text


def files_of(folder):
    """{relative path: sha256} of every file below `folder`."""
    out = {}
    for where, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(where, name)
            out[os.path.relpath(path, folder)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
    return out


def docs_commands(page):
    """The `python ...` commands of docs/`page`, in its order, as argv lists without `python`."""
    return [argv[1:] for _, argv in shell_commands(command_lines(page)) if argv[0] == "python"]


# ----------------------------------------------------------------------------- a run's own directory
def test_the_docs_commands_that_read_a_run_leave_it_unchanged(workspace, monkeypatch, capsys):
    monkeypatch.chdir(workspace)
    reading = [c for c in docs_commands("pretrained.md")
               if any(a.startswith(("model.pretrained=runs/", "train.teacher=runs/", "data.root=features/"))
                      or a == "runs/quickstart" for a in c)]
    assert [c[0] for c in reading] == ["train.py"] * 3 + ["scripts/extract_features.py", "train.py"]
    sources = ["runs/quickstart", "features/qs"]
    for argv in reading:
        before = {s: files_of(s) for s in sources}
        if argv[0] == "train.py":
            assert _train(argv[1:] + TINY) == 0, argv
            out = next(a.split("=", 1)[1] for a in argv if a.startswith("train.output_dir="))
            assert os.path.isfile(os.path.join(out, "summary.json")) and out not in sources
        else:
            assert _extract(argv[1:] + TINY_DATA) == 0, argv
        after = {s: files_of(s) for s in sources}
        for source in sources:  # a source's files: every byte as before (the extraction creates features/qs)
            assert after[source] == before[source] or (not before[source] and "--output" in argv), (argv, source)
    capsys.readouterr()


@pytest.mark.parametrize("key", ["model.pretrained", "train.teacher", "data.root"])
def test_a_run_reading_from_its_own_directory_is_refused_before_it_is_touched(workspace, monkeypatch, capsys, key):
    monkeypatch.chdir(workspace)
    source = {"model.pretrained": SOURCE, "train.teacher": SOURCE, "data.root": SOURCE + "/features"}[key]
    os.makedirs(source, exist_ok=True)
    extra = {"model.pretrained": [], "train.teacher": ["train.distill=soft"],
             "data.root": ["data.dataset=features"]}[key]
    before = files_of(SOURCE)
    for flags in ([], ["--overwrite"]):  # the docs' example before it named train.output_dir
        reset_accelerate_state()
        import train

        with pytest.raises(SystemExit) as exit_info:
            run_cli(train.main, ["--config", QUICKSTART, f"{key}={source}", *extra, *flags])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err
        assert f"error: {key}={source}" in err and "train.output_dir=runs/quickstart" in err
        assert "set another train.output_dir, e.g. train.output_dir=runs/quickstart_" in err
        assert files_of(SOURCE) == before  # nothing written, deleted or locked there
    if key == "data.root":
        os.rmdir(source)


def test_an_extraction_into_its_own_source_run_is_refused(workspace, monkeypatch):
    monkeypatch.chdir(workspace)
    before = files_of(SOURCE)
    line = _one_line(lambda: _extract(["--checkpoint", SOURCE, "--output", SOURCE]))
    assert "holds the source --checkpoint" in line and "--output features/quickstart" in line
    assert files_of(SOURCE) == before


# ----------------------------------------------------------------------------- feature identity
def _other_weights(path, out):
    """The source's weights with every tensor moved: the same shapes, other features."""
    save_file({k: v + 0.5 if v.is_floating_point() else v for k, v in load_file(path).items()}, out)
    return out


def test_a_resume_or_a_comparison_on_re_extracted_features_is_refused(workspace, monkeypatch, capsys):
    import compare_heads

    monkeypatch.chdir(workspace)
    extract = [*TINY_DATA, "--output", "feat/f", "--splits", "train", "val"]
    assert _extract(["--checkpoint", SOURCE, *extract]) == 0
    meta = json.load(open("feat/f/features.json"))
    probe = ["--config", QUICKSTART, "data.dataset=features", "data.root=feat/f", "data.hflip=0",
             "data.crop_padding=0", "train.output_dir=runs/feat_probe", *TINY]
    assert _train(probe) == 0
    saved = yaml.safe_load(open("runs/feat_probe/config.yaml"))["data"]
    summary = json.load(open("runs/feat_probe/summary.json"))["features"]
    assert saved["features_source_sha256"] == summary["source_sha256"] == meta["source_sha256"]
    assert len(saved["features_settings_sha256"]) == 64 == len(summary["settings_sha256"])
    compare = ["--config", QUICKSTART, "--features", "feat/f", "--heads", "softmax", "--seeds", "0",
               "--runs-dir", "runs/feat_cmp", "--report-dir", "reports/feat_cmp", "--ood-dataset", "none",
               "--no-mlflow", *TINY]  # (MLflow's log: test_trackers.py; seconds here)
    reset_accelerate_state()
    assert compare_heads.main(compare) == 0

    shutil.rmtree("feat/f")  # the same folder, extracted again from other weights
    other = _other_weights(os.path.join(SOURCE, "model.safetensors"), "other.safetensors")
    assert _extract(["--checkpoint", other, "--config", os.path.join(SOURCE, "config.yaml"), *extract]) == 0
    new = json.load(open("feat/f/features.json"))["source_sha256"]
    line = _one_line(lambda: _train(probe + ["--resume", "auto"]))
    assert (f"the features at data.root were re-extracted from other weights since this run started (sha256 "
            f"{meta['source_sha256'][:12]}… → {new[:12]}…)") in line and "start a new run" in line
    import eval as eval_entry

    line = _one_line(lambda: eval_entry.main(["--checkpoint", "runs/feat_probe"]))  # nor evaluated on them
    assert "were extracted from other weights" in line and "than the probe was trained on" in line
    line = _one_line(lambda: compare_heads.main(compare + ["--report-only"]))
    assert "runs/feat_cmp/softmax-s0 was trained with other settings (data.features_source_sha256" in line
    capsys.readouterr()


# ----------------------------------------------------------------------------- hash what you load
def swap_after_first_read(monkeypatch, path, other):
    """Replace the file at `path` by the file `other` as soon as a first reader of it has closed it,
    as a source run's export between two reads would."""
    real_open, target, done = builtins.open, os.path.realpath(path), []

    def opening(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if not done and "rb" in mode and isinstance(file, (str, os.PathLike)) and os.path.realpath(file) == target:
            closing = f.close

            def close():
                closing()
                if not done:
                    done.append(True)
                    shutil.copyfile(other, path + ".new")
                    os.replace(path + ".new", path)
            f.close = close
        return f

    monkeypatch.setattr(builtins, "open", opening)
    return done


@pytest.mark.parametrize("what", ["model.pretrained", "train.teacher", "extraction"])
def test_the_recorded_sha256_is_that_of_the_weights_loaded(workspace, tmp_path, monkeypatch, what):
    from training.run import setup

    weights = str(tmp_path / "w.safetensors")
    shutil.copyfile(os.path.join(workspace, SOURCE, "model.safetensors"), weights)
    other = _other_weights(weights, str(tmp_path / "other.safetensors"))
    by_sha = {hashlib.sha256(open(p, "rb").read()).hexdigest(): load_file(p) for p in (weights, other)}
    swapped = swap_after_first_read(monkeypatch, weights, other)
    if what == "extraction":
        assert _extract(["--checkpoint", weights, "--config", os.path.join(workspace, SOURCE, "config.yaml"),
                         *TINY_DATA, "--output", str(tmp_path / "f"), "--splits", "val"]) == 0
        sha = json.load(open(tmp_path / "f" / "features.json"))["source_sha256"]
        loaded = load_file(str(tmp_path / "f" / "classifier.safetensors"))
    else:
        import configs

        extra = [f"model.pretrained={weights}"] if what == "model.pretrained" else \
            ["train.distill=soft", f"train.teacher={weights}"]
        cfg = configs.load_config(os.path.join(ROOT, QUICKSTART),
                                  [*TINY, f"train.output_dir={tmp_path / 'run'}", *extra])
        reset_accelerate_state()
        run = setup(cfg, resume=None, overwrite=False)
        run.lock.release()
        model = run.learner.raw_model if what == "model.pretrained" else run.learner.distiller.teacher
        sha = cfg.model.pretrained_sha256 if what == "model.pretrained" else cfg.train.teacher_sha256
        loaded = {k: v for k, v in model.state_dict().items() if k.startswith("blocks.0.")}
    assert swapped and sha in by_sha  # the file did change under the reader
    assert all(torch.equal(v, by_sha[sha][k]) for k, v in loaded.items()) and loaded


def test_eval_ties_its_thresholds_and_memory_to_the_weights_it_evaluated(workspace, tmp_path, monkeypatch, capsys):
    """A run's model.safetensors replaced while eval.py runs (the run still training, exporting each
    epoch): conformal.json and the OOD feature memory name the sha256 of the weights evaluated, so
    predict.py refuses those thresholds for the new file instead of applying them to it."""
    import eval as eval_entry
    import predict
    from evaluation.calibration_file import conformal_path, load_thresholds

    run = tmp_path / "run"
    shutil.copytree(os.path.join(workspace, SOURCE), run, ignore=shutil.ignore_patterns("checkpoints"))
    weights = str(run / "model.safetensors")
    evaluated = hashlib.sha256(open(weights, "rb").read()).hexdigest()
    other = _other_weights(weights, str(tmp_path / "other.safetensors"))
    swapped = swap_after_first_read(monkeypatch, weights, other)
    reset_accelerate_state()
    assert eval_entry.main(["--checkpoint", str(run), "--output", str(tmp_path / "eval.json"), "--quiet",
                            "--ood-dataset", "auto", "--ood-memory", "16"]) == 0
    assert swapped and hashlib.sha256(open(weights, "rb").read()).hexdigest() != evaluated
    assert load_thresholds(conformal_path(str(run), "raw"))["weights_sha256"] == evaluated
    memory = json.load(open(tmp_path / "eval.json"))["ood"]["memory"]["path"]
    with safe_open(memory, "pt") as f:
        assert f.metadata()["weights_sha256"] == evaluated

    image = tmp_path / "img.png"
    Image.new("RGB", (20, 24), (90, 30, 200)).save(image)
    reset_accelerate_state()
    capsys.readouterr()
    assert predict.main(["--checkpoint", str(run), "--images", str(image), "--output", str(tmp_path / "p.jsonl")]) == 0
    assert "was calibrated on other weights" in capsys.readouterr().err


# ----------------------------------------------------------------------------- messages
def test_messages_name_the_real_cause(workspace, tmp_path, monkeypatch):
    monkeypatch.chdir(workspace)
    marker = tmp_path / "the_payload_ran"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)

    evil = str(tmp_path / "evil.pth")
    torch.save({"head.weight": Payload()}, evil)
    for key in ("model.pretrained", "train.teacher"):
        extra = ["train.distill=soft"] if key == "train.teacher" else []
        line = _one_line(lambda: _train(["--config", QUICKSTART, f"{key}={evil}", *extra, *TINY,
                                         f"train.output_dir={tmp_path / 'evil'}"]))
        assert "weights_only=False" not in line and "could run code" in line and "posix.system" in line
        assert not marker.exists()

    line = _one_line(lambda: _train(["--config", QUICKSTART, f"model.pretrained={SOURCE}", "model.pool=hopfield",
                                     *TINY, f"train.output_dir={tmp_path / 'pool'}"]))
    assert "'pool.query'" in line and "model.pool" in line and "model.norm" not in line

    weights = str(tmp_path / "w.safetensors")
    shutil.copyfile(os.path.join(SOURCE, "model.safetensors"), weights)
    fine_tune = ["--config", QUICKSTART, f"model.pretrained={weights}", *TINY, f"train.output_dir={tmp_path / 'ft'}"]
    assert _train(fine_tune) == 0
    old = hashlib.sha256(open(weights, "rb").read()).hexdigest()
    _other_weights(weights, weights)
    new = hashlib.sha256(open(weights, "rb").read()).hexdigest()
    line = _one_line(lambda: _train(fine_tune + ["--resume", "auto"]))
    assert (f"the file at model.pretrained changed since this run started (sha256 {old[:12]}… → {new[:12]}…)"
            in line) and "another model" not in line
