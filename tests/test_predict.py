"""predict.py on the tiny comparison's trained runs (tests/test_compare.py): the validation images,
written out as PNG files, get eval.py's probabilities and eval.py's conformal sets; bad inputs are
one line and exit 2; unreadable files are skipped, counted and listed."""
import contextlib
import io
import json
import math
import os
import subprocess
import sys

import pytest
from PIL import Image

from markdown_docs import docs_text
from test_compare import ROOT, tiny_comparison, tiny_run_dir

PREDICT = os.path.join(ROOT, "predict.py")


def _load_json(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def val_images(tmp_path_factory):
    """The run's val split as files, VAL/<class>/<index>.png: the same pixels eval.py evaluates."""
    import configs
    import data

    cfg = configs.load_run_config(tiny_run_dir())
    ds = data.build_dataset(cfg.data, "val")
    names = data.class_names(cfg.data)
    root = tmp_path_factory.mktemp("val")
    for i in range(len(ds)):
        image, label, _ = ds.load(i)
        os.makedirs(root / names[label], exist_ok=True)
        image.save(root / names[label] / f"{i:04d}.png")
    return str(root), names


def _predict(args):
    """predict.py's main in this process (-> its exit status and stderr): no interpreter start-up per call."""
    import contextlib
    import io

    import predict

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = predict.main(args)
    return status, err.getvalue()


@pytest.fixture(scope="module")
def predictions(val_images, tmp_path_factory):
    """{head: (rows by val index, stderr)} of predict.py --topk 10 (all classes) on the val images."""
    out = {}
    for head in ("softmax", "sparsemax"):
        path = str(tmp_path_factory.mktemp("preds") / "preds.jsonl")
        status, stderr = _predict(["--checkpoint", tiny_run_dir(head), "--images", val_images[0], "--output", path,
                                   "--topk", "10", "--batch-size", "16"])
        assert status == 0, stderr
        rows = [json.loads(line) for line in open(path)]
        out[head] = ({int(os.path.basename(r["path"])[:-4]): r for r in rows}, stderr)
    return out


def test_probabilities_equal_eval_py(predictions, val_images):
    from common.rundir import examples_path
    from evaluation.examples import load_examples

    names = val_images[1]
    for head, (rows, _) in predictions.items():
        records, meta = load_examples(examples_path(os.path.join(tiny_run_dir(head), "eval.json")))
        assert meta["split"] == "val" and sorted(rows) == list(range(len(records["label"]))) == list(range(101))
        for i, row in rows.items():
            probs = {t["class"]: t["prob"] for t in row["topk"]}
            assert len(probs) == (len(row["support"]) if head == "sparsemax" else 10)  # sparse: no p = 0 listed
            assert math.isclose(sum(probs.values()), 1.0, abs_tol=1e-5) and \
                all(len(repr(p)) <= 13 for p in probs.values())
            assert row["topk"][0]["prob"] == pytest.approx(float(records["max_prob"][i]), abs=1e-5)
            assert probs.get(names[int(records["label"][i])], 0.0) == pytest.approx(float(records["p_y"][i]), abs=1e-5)
            assert row["topk"][0]["class"] == names[int(records["pred"][i])] or \
                row["topk"][0]["prob"] == pytest.approx(row["topk"][1]["prob"], abs=1e-6)  # a tie for the top
            if head == "sparsemax":
                assert len(row["support"]) == int(records["support_size"][i])
                assert set(row["support"]) == {c for c, p in probs.items() if p > 0}
            else:
                assert "support" not in row  # softmax has no sparse support


def test_conformal_sets_equal_eval_py(predictions, val_images):
    """eval.py calibrated on the run's calib split and measured the sets on the whole val split: the
    same images' sets from predict.py have eval.py's coverage and mean size at every ε, exactly."""
    names = val_images[1]
    label_of = {i: os.path.basename(os.path.dirname(r["path"])) for i, r in predictions["sparsemax"][0].items()}
    for head, (rows, _) in predictions.items():
        run = tiny_run_dir(head)
        result = _load_json(os.path.join(run, "eval.json"))["prediction_sets"]
        saved = _load_json(os.path.join(run, "conformal.json"))
        assert saved["head"] == head and saved["calibration"]["n_calib"] == result["calibration"]["n_calib"] == 64
        assert result["calibration"]["source"] == "calib" and result["calibration"]["n_eval"] == len(rows)
        for method in ("support", "lac"):
            if method not in result["methods"]:
                assert head == "softmax" and method not in rows[0]["sets"]
                continue
            for eps, measured in result["methods"][method]["eps"].items():
                saved_q = [t["threshold"] for t in saved["thresholds"]
                           if t["method"] == method and t["epsilon"] == float(eps)]
                assert saved_q == [measured["threshold"]]
                sets = [rows[i]["sets"][method][eps] for i in sorted(rows)]
                assert all(set(s) <= set(names) for s in sets)
                coverage = sum(label_of[i] in rows[i]["sets"][method][eps] for i in rows) / len(rows)
                assert sum(map(len, sets)) / len(sets) == pytest.approx(measured["mean_set_size"], abs=1e-12)
                assert coverage == pytest.approx(measured["coverage"], abs=1e-12)
        assert set(rows[0]["sets"]) == set(result["methods"])  # aps too


def test_csv_output_and_unreadable_files(tmp_path, val_images):
    import csv

    folder = tmp_path / "mixed"
    folder.mkdir()
    source = os.path.join(val_images[0], val_images[1][0])
    first = sorted(os.listdir(source))[:3]
    for name in first:
        Image.open(os.path.join(source, name)).resize((40, 29)).save(folder / name)  # landscape, resized
    (folder / "broken.png").write_bytes(b"not a png")
    (folder / "notes.txt").write_text("ignored: not an image name")
    out = tmp_path / "preds.csv"
    status, stderr = _predict(["--checkpoint", tiny_run_dir("sparsemax"), "--images", str(folder), "--output", str(out),
                               "--topk", "2"])
    assert status == 0 and "warning: 1 unreadable file(s) skipped" in stderr
    rows = list(csv.DictReader(open(out)))
    assert [os.path.basename(r["path"]) for r in rows] == sorted(first + ["broken.png"])
    broken = [r for r in rows if r["status"] == "unreadable"]
    assert len(broken) == 1 and broken[0]["path"].endswith("broken.png")
    assert "UnidentifiedImageError" in broken[0]["error"]
    for row in rows:
        if row["status"] == "ok":
            assert float(row["prob_1"]) >= float(row["prob_2"]) >= 0 and row["class_1"] in val_images[1]
            assert row["class_1"] in row["support"].split(";")
            assert set(row["set_support_eps0.1"].split(";")) <= set(val_images[1])


def test_bad_inputs_are_one_line(tmp_path, one_line_error):
    run = tiny_run_dir("sparsemax")
    out = str(tmp_path / "p.csv")

    def error(images, checkpoint=run, output=out):
        return one_line_error("predict", ["--checkpoint", checkpoint, "--images", str(images), "--output", output])

    (tmp_path / "empty").mkdir()
    assert "is empty" in error(tmp_path / "empty")
    (tmp_path / "texts").mkdir()
    (tmp_path / "texts" / "readme.txt").write_text("hello")
    assert "holds 1 file(s) but no images" in error(tmp_path / "texts")
    assert "checkpoint not found" in error(tmp_path, checkpoint=str(tmp_path / "no_such_run"))
    assert "no such folder, file or glob match" in error(tmp_path / "nothing_here")
    assert "no file matches" in error(tmp_path / "*.png")
    (tmp_path / "list.txt").write_text("a.png\nb.png\na.png\n")
    assert "line 3 repeats line 1" in error(tmp_path / "list.txt")
    assert "the extension picks the format" in error(tmp_path, output=str(tmp_path / "p.txt"))
    # only unreadable files: listed in the output, and an error
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.jpg").write_bytes(b"\xff\xd8 truncated")
    line = error(tmp_path / "bad")
    assert "none of the 1 file(s) could be read" in line and "unreadable" in open(out).read()
    assert "exists; pass --overwrite" in error(tmp_path / "bad")


def test_images_that_cannot_match_the_model_are_refused(tmp_path, one_line_error, val_images):
    run = tiny_run_dir("sparsemax")
    out = str(tmp_path / "p.csv")
    images = val_images[0]
    (tmp_path / "five.txt").write_text("a\nb\nc\nd\ne\n")
    line = one_line_error("predict", ["--checkpoint", run, "--images", images, "--output", out,
                           "--classes", str(tmp_path / "five.txt")])
    assert "do not match the ones" in line  # the run's classes.json has 10 others
    weights = os.path.join(run, "model.safetensors")
    line = one_line_error("predict", ["--checkpoint", weights, "--config", os.path.join(run, "config.yaml"),
                           "--classes", str(tmp_path / "five.txt"), "--images", images, "--output", out])
    assert "lists 5 classes but the weights" in line and "classify 10" in line
    config = open(os.path.join(run, "config.yaml")).read().replace("image_size: 32", "image_size: 24")
    assert "image_size: 24" in config
    (tmp_path / "other.yaml").write_text(config)
    line = one_line_error("predict", ["--checkpoint", weights, "--config", str(tmp_path / "other.yaml"),
                           "--images", images, "--output", out])
    assert "was trained at 32 px" in line and "set data.image_size=32" in line  # one image-size key


def test_stale_thresholds_are_not_used(tmp_path, val_images):
    """A run whose weights changed since eval.py calibrated it: no sets, and a warning saying why."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir("sparsemax"), run, ignore=shutil.ignore_patterns("checkpoints"))
    from safetensors.torch import load_file, save_file

    state = load_file(run / "model.safetensors")
    state["head.bias"] = state["head.bias"] + 1.0  # other weights, same shapes
    save_file(state, run / "model.safetensors")
    out = tmp_path / "p.jsonl"
    status, stderr = _predict(["--checkpoint", str(run), "--images", val_images[0], "--output", str(out)])
    assert status == 0 and "was calibrated on other weights" in stderr
    assert all("sets" not in json.loads(line) for line in open(out))


def test_two_processes_give_the_rows_of_one(tmp_path, val_images, predictions):
    from test_eval import _free_port

    out = tmp_path / "two.jsonl"
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(_free_port()),
           PREDICT, "--checkpoint", tiny_run_dir("sparsemax"), "--images", val_images[0], "--output", str(out),
           "--topk", "10", "--batch-size", "16"]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "2 process(es)" in proc.stdout
    two = [json.loads(line) for line in open(out)]
    one = predictions["sparsemax"][0]
    assert [r["path"] for r in two] == [one[i]["path"] for i in sorted(one, key=lambda i: one[i]["path"])]
    for row in two:
        ref = one[int(os.path.basename(row["path"])[:-4])]
        assert row["sets"] == ref["sets"] and row["support"] == ref["support"]
        assert [t["class"] for t in row["topk"]] == [t["class"] for t in ref["topk"]]
        assert [t["prob"] for t in row["topk"]] == pytest.approx([t["prob"] for t in ref["topk"]], abs=1e-6)


def test_the_small_calibration_warning_reaches_eval_the_thresholds_and_the_report():
    """64 calibration samples: eval.py's result, RUN/conformal.json and the comparison report say so."""
    root, _ = tiny_comparison()
    result = _load_json(os.path.join(tiny_run_dir(), "eval.json"))["prediction_sets"]
    assert result["warning"].startswith("warning: prediction sets calibrated on only 64 samples")
    assert _load_json(os.path.join(tiny_run_dir(), "conformal.json"))["warning"] == result["warning"]
    report = open(os.path.join(root, "report", "report.md")).read()
    assert "- Note: prediction sets calibrated on only 64 samples" in report


def test_the_docs_python_snippet_gives_predict_pys_top_classes(tmp_path, predictions):
    """docs/predict.md's Python inference example, as written (its two paths swapped for a tiny run and
    a grey image of an odd size), prints the non-zero classes predict.py ranks first."""
    text = docs_text("predict.md", "From Python")
    start = text.index("```python", text.index("The same from Python"))
    code = text[start + len("```python"):text.index("```", start + 3)]
    assert len(code.strip().splitlines()) <= 6
    image = tmp_path / "grey.png"
    Image.new("L", (45, 29), 90).save(image)
    run = tiny_run_dir("sparsemax")
    code = code.replace('"runs/quickstart"', repr(run)).replace('"photo.png"', repr(str(image)))
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # run as written, in this process (its imports as a user's)
        exec(compile(code, "docs/predict.md", "exec"), {"__name__": "__main__"})
    printed = eval(printed.getvalue())  # [(probability, class)], best first
    out = tmp_path / "p.jsonl"
    status, err = _predict(["--checkpoint", run, "--images", str(image), "--output", str(out), "--topk", "5"])
    assert status == 0, err
    row = json.loads(out.read_text())
    assert {c: p for p, c in printed} == pytest.approx({t["class"]: t["prob"] for t in row["topk"]}, abs=1e-4)
    assert all(p > 0 for p, _ in printed)


def test_a_runs_own_classes_json_gets_the_classes_files_checks(tmp_path, one_line_error, val_images):
    """A class listed twice, or a count other than the weights', in RUN_DIR/classes.json: one line naming it."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(tiny_run_dir("sparsemax"), run, ignore=shutil.ignore_patterns("checkpoints"))
    names = _load_json(run / "classes.json")["classes"]
    args = ["--checkpoint", str(run), "--images", val_images[0], "--output", str(tmp_path / "p.csv")]
    (run / "classes.json").write_text(json.dumps({"classes": [names[0]] + names[:-1]}))
    line = one_line_error("predict", args)
    assert f"classes.json lists {names[0]!r} twice (entries 1 and 2): each class once" in line
    (run / "classes.json").write_text(json.dumps({"classes": names[:-1]}))
    line = one_line_error("predict", args)
    assert "classes.json lists 9 classes but the weights" in line and "restore the classes.json train.py wrote" in line
