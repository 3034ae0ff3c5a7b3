import os
import shutil
import sys

# Tests import the project packages (models, data, configs) from the repository root, and the
# scripts as modules from scripts/ (where each finds its scripts/_root.py): the tests' one sys.path edit.
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for path in (os.path.join(ROOT, "scripts"), ROOT):
    if path not in sys.path:
        sys.path.insert(0, path)

# Every process a test starts (train.py, compare_heads' runs, accelerate's ranks) inherits one thread;
# this process too (torch reads it at import).
os.environ["OMP_NUM_THREADS"] = "1"
os.environ["MKL_NUM_THREADS"] = "1"

import torch

# One intra-op thread per test process: pytest-xdist already runs one worker per core, and a second
# torch thread per worker oversubscribes the cores; on a loaded machine its OpenMP spin-waits then
# cost many times the work itself (a test that sets more threads restores them).
torch.set_num_threads(1)

import pytest

from session_dir import make_session_dir

# The longest test files first (measured: most start several real processes or train tiny runs), so
# that under `--dist loadfile` (make test) the workers begin with them and the short files fill the
# end of the run instead of one long file making a tail. The files that read the shared tiny
# comparison come after enough other work for its build (by test_compare_worker.py) to be done.
SLOW_FIRST = ("test_results_record.py", "test_compare_worker.py", "test_tune_workers.py", "test_launcher_signals.py",
              "test_weights_record.py", "test_readme_numbers.py",
              "test_trackers.py", "test_tracker_records.py", "test_train_resume.py", "test_resume_world_size.py",
              "test_compare.py", "test_run_safety.py", "test_tune.py", "test_eval.py", "test_heads.py",
              "test_features.py", "test_predict.py", "test_launch_lines.py", "test_timm_contract.py",
              "test_train_distributed.py", "test_docs_chain.py", "test_equivalence.py", "test_export.py",
              "test_distill.py", "test_model.py", "test_seed_report.py", "test_pool_support.py")


def pytest_configure(config):
    """The controller (or the one process without xdist) makes the run's shared folder before any
    worker starts (tests/session_dir.py)."""
    if not hasattr(config, "workerinput"):
        config._resmlp_session_dir = make_session_dir()


def pytest_unconfigure(config):
    if getattr(config, "_resmlp_session_dir", None):
        shutil.rmtree(config._resmlp_session_dir, ignore_errors=True)


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(SLOW_FIRST)))  # stable: file order kept otherwise


@pytest.fixture(autouse=True)
def _keep_denormals_after_in_process_training():
    """training.run.setup flushes denormals to zero for the whole process (a CPU speed guard); a test that
    trains in-process must not leave that on for later tests (hypothesis refuses to draw subnormal
    floats under flush-to-zero, and the float64 references need them)."""
    yield
    torch.set_flush_denormal(False)


@pytest.fixture
def one_thread():
    """One torch thread for the test, then the count it had: on shared cores one thread is faster
    than two contended ones (as run_inprocess does). Files of in-process trainings use it for all
    their tests: pytestmark = pytest.mark.usefixtures("one_thread")."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def one_line_error(capsys):
    """run(entry, args): call entry point `entry` ("eval", "train", "predict") as its command line does
    (common.cli.run_cli) and return its one `error:` line, after checking exit 2."""
    import importlib

    from common.cli import run_cli

    def run(entry, args):
        with pytest.raises(SystemExit) as exit_info:
            run_cli(importlib.import_module(entry).main, args)
        assert exit_info.value.code == 2
        errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, errors
        return errors[0]
    return run
