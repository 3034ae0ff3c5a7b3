"""Every ```python block of every page (README.md and docs/*.md) runs, as a reader pastes it: a page's
blocks in order in one fresh namespace (a later block uses the names of earlier ones), in a fresh
Python (what `import models` registers must not come from an earlier test's imports), started in a
folder of its own that holds tiny stand-ins for the files the page names as the reader's (a run
folder, a weights file, an image), with the project importable as from the repository root. The
text of a snippet is run unchanged; a failure names the page, the block's line and the exception."""
import json
import os
import subprocess
import sys

import pytest
import torch
from PIL import Image

from markdown_docs import ROOT, docs_text, pages, python_blocks

# torch and torchvision are imported once, then each page runs in a process forked from that one
# (Linux; elsewhere a fresh Python per page): their import is most of a page's time, and neither
# imports timm nor the project, so what `import models` does still starts from a process without them.
PRELOAD = ("torch", "torchvision")
FORK_PAGES = sys.platform == "linux"
MARK = "@@docs-snippet@@ "  # the runner's records on stderr, among the snippets' own output

# The program that runs the pages (-c: the folder it is in first on its path, as for `python` typed
# there): argv[1] the modules to import first, argv[2] [[page, folder, [[fence line, code], ...]], ...].
# Each block is compiled under the page's name, padded to its own line numbers, so a traceback points
# into the page; a page's first exception ends that page, with a record naming it.
RUNNER = f"""\
import importlib, json, os, sys, traceback
MARK = {MARK!r}


def report(**record):
    print(MARK + json.dumps(record), file=sys.stderr, flush=True)


def run_page(page, folder, blocks):
    os.chdir(folder)
    namespace = {{"__name__": "__main__"}}
    for fence, code in blocks:
        try:
            exec(compile("\\n" * fence + code, page, "exec"), namespace)
        except BaseException as err:
            frames = [f.lineno for f in traceback.extract_tb(err.__traceback__) if f.filename == page]
            line = err.lineno if isinstance(err, SyntaxError) and err.filename == page else (frames or [None])[-1]
            report(page=page, fence=fence, line=line, error=traceback.format_exception_only(err)[-1].strip(),
                   traceback=traceback.format_exc())
            return 1
    return 0


for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
runs = json.loads(sys.argv[2])
for page, folder, blocks in runs:
    if len(runs) == 1:
        status = run_page(page, folder, blocks)
    else:
        pid = os.fork()
        if pid == 0:  # the child runs the page and exits, whatever happens: never back into this loop
            status = 1
            try:
                status = run_page(page, folder, blocks)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(status)
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    report(page=page, exit=status)
"""


def run_pages(runs, preload=PRELOAD, root=ROOT, timeout=300):
    """Run each page's blocks, `runs` [(page, folder, [(fence line, code)])], each page in a process of its
    own started in its folder, the project at `root` importable -> {page: None, or its failure in one
    message naming the page, the block's line, the line in the page and the exception}."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    failures = {}
    for batch in ([runs] if FORK_PAGES else [[run] for run in runs]):
        proc = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(preload), json.dumps(batch)], env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        records = {}
        for line in proc.stderr.splitlines():
            if line.startswith(MARK):
                record = json.loads(line[len(MARK):])
                records.setdefault(record["page"], {}).update(record)
        for page, _, _ in batch:
            failures[page] = failure_message(page, records.get(page, {}), proc)
    return failures


def failure_message(page, record, proc):
    if record.get("exit") == 0:
        return None
    if "fence" in record:
        at = f", line {record['line']}" if record["line"] else ""
        return (f"{page}: the python block at line {record['fence']} fails{at}: {record['error']}\n"
                f"{record['traceback']}")
    status = record.get("exit", proc.returncode)  # it died without the runner's word: a crash, a kill
    return f"{page}: its python blocks did not finish (exit status {status}):\n{proc.stderr[-3000:]}"


# ------------------------------------------------------------------- the stand-ins a page's snippets read
def original_resmlp_s12_weights(path):
    """The original FB/DeiT file's layout ({"model": ...} under FB's names) for resmlp_s12 at 1000 classes."""
    from models.convert import to_timm_state_dict
    from models.resmlp import create_resmlp
    from test_model import fb_state_dict_from_timm

    with torch.device("meta"):  # the values do not matter, only names and shapes: no initialisation
        net = create_resmlp("resmlp_s12", num_classes=1000)
    weights = {k: torch.zeros(v.shape) for k, v in to_timm_state_dict(net.state_dict()).items()}
    torch.save({"model": fb_state_dict_from_timm(weights)}, path)


def trained_run(path):
    """A finished run of this project: the tiny comparison's sparsemax run (read only, linked)."""
    from test_compare import tiny_run_dir

    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(tiny_run_dir("sparsemax"), path)


def photo(path):
    Image.new("RGB", (45, 29), (90, 140, 200)).save(path)  # an odd size: the run's transform resizes it


# The files each page's snippets read, named there as the reader's own: made in the snippet's folder.
STAND_INS = {
    "docs/models.md": {"resmlp_12_no_dist.pth": original_resmlp_s12_weights},
    "docs/predict.md": {"runs/quickstart": trained_run, "photo.png": photo},
}


SNIPPET_PAGES = [page for page in pages() if python_blocks(page)]


@pytest.fixture(scope="module")
def failures(tmp_path_factory):
    """{page: None or its failure}: every page's blocks run, each page in its own folder with its stand-ins."""
    runs = []
    for page in SNIPPET_PAGES:
        folder = tmp_path_factory.mktemp("snippets")
        for name, make in STAND_INS.get(page, {}).items():
            make(str(folder / name))
        runs.append((page, str(folder), python_blocks(page)))
    return run_pages(runs)


@pytest.mark.parametrize("page", SNIPPET_PAGES)
def test_every_python_block_runs(page, failures):
    blocks = python_blocks(page)
    lines = docs_text(page).splitlines(keepends=True)
    for fence, code in blocks:  # the line numbers point at the blocks' fences
        assert lines[fence - 1].startswith("```") and "".join(lines[fence:]).startswith(code), (page, fence)
    code = "".join(c for _, c in blocks)
    for name in STAND_INS.get(page, {}):
        assert name in code, f"{page}: its python blocks no longer read {name}: drop it from STAND_INS"
    assert failures[page] is None, failures[page]


def test_the_runner_names_a_failing_block_its_line_and_exception(tmp_path):
    """The runner itself, without the preload (a second): each page in its own folder and process (a
    page's imports are not the next one's), one namespace across a page's blocks, the pages after a
    failing one still run, and a failure names the page, the block's fence line, the line in the page
    and the exception (a syntax error, a crash too)."""
    assert set(STAND_INS) <= set(SNIPPET_PAGES), "STAND_INS names a page without python blocks"
    for name in "abc":
        (tmp_path / name).mkdir()
        (tmp_path / name / "here.txt").write_text(name)
    runs = [("docs/a.md", str(tmp_path / "a"), [(3, "x = 1\n"),
                                                (7, "assert x == 1 and open('here.txt').read() == 'a'\n"
                                                    "import sys\nsys.modules['docs_probe'] = sys\n")]),
            ("docs/b.md", str(tmp_path / "b"), [(3, "x = 1\n"), (7, "y = x + 1\nz = y + undefined_name\n")]),
            ("README.md", str(tmp_path / "c"), [(2, "import sys\nassert 'docs_probe' not in sys.modules\n"
                                                    "assert 'x' not in dir() and open('here.txt').read() == 'c'\n"),
                                                (10, "x = (\n")]),
            ("docs/c.md", str(tmp_path / "c"), [(5, "import os\nos._exit(3)\n")])]
    failures = run_pages(runs, preload=())
    assert failures["docs/a.md"] is None, failures["docs/a.md"]
    assert failures["docs/b.md"].startswith("docs/b.md: the python block at line 7 fails, line 9: "
                                            "NameError: name 'undefined_name' is not defined\n"), failures["docs/b.md"]
    assert failures["README.md"].startswith("README.md: the python block at line 10 fails, line 11: SyntaxError:"), \
        failures["README.md"]
    assert failures["docs/c.md"].startswith("docs/c.md: its python blocks did not finish (exit status 3)"), \
        failures["docs/c.md"]
    assert run_pages(runs[1:2], preload=()) == {"docs/b.md": failures["docs/b.md"]}  # one page: run without a fork
