"""compare_heads --tune with Optuna's distributed pieces (comparison/tuning.py, comparison/tuning_storage.py):
a trial SIGKILLed before and after its first checkpoint is retried and finishes cleanly, the docs'
recipe of several workers started at once on one study (journal file and SQLite) runs exactly the
budget, and trial folders of another study are refused. Cached features keep each trial tiny."""
import os
import re
import signal
import subprocess
import sys

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from feature_folder import write_feature_folder  # noqa: E402
from test_tune import CONFIG, _args, _compare, _studies  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

# compare_heads in a process that SIGKILLs itself at a checkpoint of trial-0001 (argv[1]: before its first
# save begins, or after its first save is committed); trials run in this process (--features).
KILLER = """
import os, signal, sys
sys.path[:0] = [{root!r}, os.path.join({root!r}, "scripts")]
from training.checkpoint import files
when, begin, commit = sys.argv[1], files.begin_save, files.commit_save

def begin_save(root, step):
    if when == "before" and "trial-0001" in root:
        os.kill(os.getpid(), signal.SIGKILL)
    return begin(root, step)

def commit_save(root, step):
    out = commit(root, step)
    if when == "after" and "trial-0001" in root:
        os.kill(os.getpid(), signal.SIGKILL)
    return out

files.begin_save, files.commit_save = begin_save, commit_save
import compare_heads
sys.exit(compare_heads.main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def feats(tmp_path_factory):
    return write_feature_folder(str(tmp_path_factory.mktemp("feat") / "f"), classes=6, spread=0.35)


@pytest.fixture
def sandbox(tmp_path, feats, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump(CONFIG, f)
    return tmp_path


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------------------------- SIGKILL
@pytest.mark.parametrize("when", ["before", "after"])
def test_trial_killed_before_or_after_its_first_checkpoint_is_retried_and_the_study_ends_at_the_budget(
        sandbox, feats, when):
    """The killed trial is failed and retried with its settings in its own folder: restarted from scratch
    when no checkpoint was complete (train.py --overwrite, never refused), resumed from it otherwise."""
    from training.checkpoint.files import find_latest, run_artefacts

    argv = _args(feats, "--heads", "softmax", "--trials", "3", "--tune-only", "--pruner", "none",
                 "train.eval_every=1", "train.save_every=1000")  # one checkpoint per epoch, at its end
    killed = subprocess.run([sys.executable, "-c", KILLER.format(root=ROOT), when, *argv], env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    lost = [t for t in _studies()["cfg/softmax"].get_trials() if t.state.name == "RUNNING"]
    assert [t.number for t in lost] == [1]
    run_dir = lost[0].user_attrs["tune.run_dir"]
    assert run_artefacts(run_dir) and (find_latest(run_dir) is None) == (when == "before")

    assert _compare(argv) == 0
    trials = _studies()["cfg/softmax"].get_trials()
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 3 and [t.state.name for t in trials if t.number == 1] == ["FAIL"]
    assert len({t.user_attrs["tune.run_dir"] for t in complete}) == 3  # no trial ran twice
    retry = [t for t in complete if t.system_attrs.get("failed_trial") == 1]
    assert len(retry) == 1 and retry[0].params == lost[0].params and retry[0].user_attrs["tune.run_dir"] == run_dir
    log = open(os.path.join(run_dir, "compare.log")).read()  # the killed trial's train.py output, then the retry's
    assert ("--overwrite: deleting" in log) == (when == "before")  # restarted from scratch, or else resumed
    assert log.count("resumed from") == 1 and "error" not in log


# --------------------------------------------------------------------------------- many workers
def _recipe():
    """The docs' recipe of several workers on one study (docs/tuning.md), as a bash script."""
    text = open(os.path.join(ROOT, "docs", "tuning.md")).read()
    return re.search(r"## Many workers on one study.*?```bash\n(.*?)```", text, re.S).group(1)


@pytest.mark.parametrize("kind", ["journal", "sqlite"])
def test_the_docs_recipe_of_workers_started_at_once_runs_exactly_the_budget(sandbox, feats, kind):
    """Two workers started in the same instant by the recipe's loop (on SQLite both create the schema at
    once; a third worker would add a Python start, not a new race): each exits 0, the study has exactly
    --trials complete trials, none run twice, and a trial a race made one too many never trained."""
    storage = {"journal": f"journal:{sandbox}/tune.journal", "sqlite": f"sqlite:///{sandbox}/tune/studies.db"}[kind]
    script = _recipe()
    script = re.sub(r"^CFG=.*$", f"CFG={sandbox}/cfg.yaml RUNS={sandbox}/runs STORAGE={storage}", script, 1, re.M)
    script = script.replace("--heads softmax sparsemax entmax15 --tune --trials 40",
                            "--heads softmax --tune --trials 4 --pruner none --ood-dataset none --no-mlflow "
                            f"--features {feats}")
    assert script.count("compare_heads.py") == 2 and "--trials 4" in script and "for worker in 1 2 3;" in script
    script = script.replace("for worker in 1 2 3;", "for worker in 1 2;")
    script = script[:script.index("\nwait") + len("\nwait")]  # the workers (the verdict runs: test_tune.py's)
    bin_dir = os.path.dirname(sys.executable)  # `python` in the recipe: this interpreter
    done = subprocess.run(["bash", "-c", "set -e\n" + script], cwd=ROOT, env={**_env(), "PATH": f"{bin_dir}:"
                          f"{os.environ['PATH']}"}, capture_output=True, text=True, timeout=600)
    logs = {n: open(f"runs/worker-{n}.log").read() for n in (1, 2)}
    assert done.returncode == 0, done.stderr[-2000:] + str(logs)
    assert not any("Traceback" in log or "error:" in log for log in logs.values()), logs
    assert all(log.strip().splitlines()[-1].startswith("tuning: 4 complete trial(s)") for log in logs.values()), logs
    trials = _studies(storage)["cfg/softmax"].get_trials()
    complete = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(complete) == 4 and len({t.user_attrs["tune.run_dir"] for t in complete}) == 4
    given_back = [t for t in trials if t.user_attrs.get("tune.surplus")]
    assert all(t.state.name == "FAIL" and "tune.run_dir" not in t.user_attrs for t in given_back)
    assert len(trials) == 4 + len(given_back)
    assert sorted(os.listdir("runs/tune/trials/softmax")) == sorted(
        os.path.basename(t.user_attrs["tune.run_dir"]) for t in complete)


# ------------------------------------------------------------------------------ foreign folders
def test_trial_folders_of_another_study_or_settings_are_refused_in_one_line(sandbox, feats, capsys):
    """A study deleted with its trial folders kept, rerun with another weight decay: its trial-0000
    holds scores of other settings; nothing is adopted, nothing trained, the study gains no trial."""
    import compare_heads
    from common.cli import run_cli

    argv = _args(feats, "--heads", "softmax", "--trials", "2", "--tune-only")
    assert _compare(argv) == 0
    folder = "runs/tune/trials/softmax/trial-0000"
    before = {n: os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)}

    def refused(extra):
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_:
            run_cli(compare_heads.main, argv + extra)
        err = capsys.readouterr().err.strip()
        assert exit_.value.code == 2 and len(err.splitlines()) == 1 and len(err) < 400, err
        return err

    err = refused(["optim.weight_decay=0.01"])  # the study itself: one line naming only what changed
    assert "other settings" in err and "optim.weight_decay: (unset) -> 0.01" in err
    assert "search optim.weight_decay: log [0.0001, 1] -> (unset)" in err and "head.name" not in err
    os.remove("runs/tune/studies.db")
    err = refused(["optim.weight_decay=0.01"])
    assert "trial-0000, trial-0001" in err and "no trial of the study 'cfg/softmax'" in err
    assert [t.state.name for t in _studies()["cfg/softmax"].get_trials()] == []
    assert {n: os.path.getmtime(os.path.join(folder, n)) for n in os.listdir(folder)} == before


def test_a_trial_folder_recorded_with_other_settings_is_refused(sandbox, feats):
    """The per-trial check behind it (comparison/ledger.py's request): the folder a trial is given holds
    a run of other settings, e.g. a config file edited since; refused in one line before anything is read."""
    from comparison.tune import trial_folder

    run_dir, config = str(sandbox / "trial-0000"), os.path.abspath("cfg.yaml")
    overrides = [f"train.output_dir={run_dir}", "head.name=softmax", "data.dataset=features", f"data.root={feats}"]
    assert trial_folder(config, run_dir, overrides) is False  # new: its request recorded, nothing to resume
    assert trial_folder(config, run_dir, overrides) is False  # the same trial again: its own folder
    with open("cfg.yaml", "w") as f:
        yaml.safe_dump({**CONFIG, "optim": {**CONFIG["optim"], "lr": 0.5}}, f)
    with pytest.raises(Exception, match=r"other settings \(optim.lr: 0.01 -> 0.5\)") as err:
        trial_folder(config, run_dir, overrides)
    assert len(str(err.value).splitlines()) == 1
