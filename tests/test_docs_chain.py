"""The pages' commands chain: pasted in the order a page shows them, on a fresh clone after
`make quickstart`, each finds what it reads.

- Static, every page (README.md and docs/*.md): each command is parsed by its entry point's own parser
  (a command that does not parse is a finding too), and every path it reads (--checkpoint,
  --features, --config, --images, model.pretrained=, train.teacher=, data.root= and the data.root its
  config reads, export.py's RUN_DIR, ...) is written by an earlier command of the page (a run's
  train.output_dir, the config's default resolved by configs.load_config, --output, compare_heads'
  run folders as its plan names them), or by `make quickstart` (the Makefile's recipe, read as such),
  or is a tracked file of the repository, or a placeholder the page's text names (an ALL-CAPS name
  such as RUN_DIR or CFG, or one of the user's own files below). Two commands writing one run folder
  or one output file (the second would be refused) are a finding too.
- Run, the tuning page's chain: the training, the extraction and the `--tune` comparison of
  docs/tuning.md, as written, shrunk by appended settings (tests/test_run_sources.py runs the
  pretrained.md chain the same way)."""
import contextlib
import io
import json
import os
import re
import shlex
from unittest import mock

import pytest

import configs
from common.errors import UserError
from markdown_docs import ROOT, command_lines, pages, prose, shell_commands
from project_files import tracked_files

# The user's own files each page reads (named in its text; never under the folders commands write).
USER_FILES = {
    "README.md": ("photos/", "datasets/imagenet", "datasets"),  # datasets: make fashion's download folder
    "docs/results.md": ("datasets",),
    "docs/training.md": ("datasets/imagenet",),
    "docs/comparison.md": ("datasets/imagenet",),
    "docs/evaluation.md": ("resmlp_12_no_dist.pth", "datasets/imagenet"),
    "docs/pretrained.md": ("weights/resmlp_12_no_dist.pth",),
    "docs/predict.md": ("photos/", "list.txt"),
    "docs/export.md": ("photos/",),
}
MADE_BY_COMMANDS = ("runs/", "features/", "reports/")  # never a user's file: some command writes them
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_]*$")  # RUN_DIR, DATA_ROOT, CFG, FILE, PATH
GLOB = re.compile(r"[*?\[]")


def makefile_recipe(target):
    """The command lines of `target`'s recipe in the Makefile, its variables substituted ($(PYTHON):
    python, the environment the docs' commands run in)."""
    with open(os.path.join(ROOT, "Makefile")) as f:
        text = f.read().replace("\\\n", " ")
    values = dict(re.findall(r"^(\w+)\s*[?:]?=\s*(.*)$", text, re.M), PYTHON="python")
    recipe = re.search(rf"^{target}:.*\n((?:\t.*\n?)*)", text, re.M).group(1)
    return [re.sub(r"\$\((\w+)\)", lambda m: values.get(m.group(1), m.group(0)), line.strip())
            for line in recipe.splitlines()]


class Chain:
    """What the commands of one page have written so far, and what they read that nothing made."""

    def __init__(self, page, tracked):
        self.page, self.tracked, self.written, self.exclusive = page, tracked, set(), {}
        self.problems, self.placeholders, self.line = [], set(), None
        self.user_files = tuple(os.path.normpath(p) for p in USER_FILES.get(page, ()))

    def made(self, path):
        path = os.path.normpath(path)
        return any(path == w or path.startswith(w.rstrip("/") + "/") for w in self.written)

    def placeholder(self, path):
        path = os.path.normpath(path)
        first = path.split("/", 1)[0]
        if PLACEHOLDER.match(first):
            self.placeholders.add(first)
            return True
        for own in self.user_files:
            if path == own or path.startswith(own + "/"):
                self.placeholders.add(own)
                return True
        return False

    def read(self, path):
        if path is None:
            return
        path = GLOB.split(path, 1)[0] or "."  # a glob reads the folder it starts in
        path = os.path.normpath(path)
        if self.made(path) or path in self.tracked or self.placeholder(path):
            return
        self.problems.append(f"{self.page}: `{self.line}` reads {path}, which no earlier command of the page "
                             f"(nor make quickstart) writes and which is neither a file of the repository nor "
                             f"a placeholder the page names")

    def write(self, path, exclusive=False):
        path = os.path.normpath(path)
        if exclusive and path in self.exclusive:
            self.problems.append(f"{self.page}: `{self.line}` writes {path}, as `{self.exclusive[path]}` did before "
                                 f"it: the second is refused (the output exists)")
        if exclusive:
            self.exclusive[path] = self.line
        self.written.add(path)

    def config(self, path, overrides):
        """The config a command resolves (None for a placeholder or a file a command wrote: not here)."""
        if os.path.normpath(path) not in self.tracked:
            return None
        return configs.load_config(os.path.join(ROOT, path), overrides)

    def config_reads(self, cfg):
        """What a resolved config reads: the weights it starts from or distils, its data."""
        from data.names import CIFAR
        from data.registry import DATASETS

        self.read(cfg.model.pretrained)
        teacher = cfg.train.teacher
        if teacher and ("/" in teacher or os.path.splitext(teacher)[1]):  # else a timm model name
            self.read(teacher)
        self.read(cfg.train.teacher_weights)
        if cfg.data.dataset in CIFAR and cfg.data.download:  # downloaded into its folder there
            self.write(os.path.join(cfg.data.root, CIFAR[cfg.data.dataset]["folder"]))
        elif DATASETS[cfg.data.dataset].files:
            self.read(cfg.data.root)

    def generic(self, words):
        """A command this test does not parse (timm's scripts, sbatch): what it names under the folders
        commands write must be made, a placeholder must be named."""
        for word in words:
            for path in re.split(r"[=:]", word)[-1:]:
                if path.startswith(MADE_BY_COMMANDS) or PLACEHOLDER.match(path.split("/", 1)[0]):
                    self.read(path)


def _train(chain, argv):
    import train

    args = train.parse_args(argv)
    chain.read(args.config)
    if args.resume not in (None, "auto"):
        chain.read(args.resume)
    cfg = chain.config(args.config, args.overrides)
    if cfg is not None:
        chain.config_reads(cfg)
        chain.write(cfg.train.output_dir, exclusive=not (args.resume or args.overwrite))


def _eval(chain, argv):
    import eval as eval_entry

    args = eval_entry.parse_args(argv)
    for path in (args.checkpoint, args.config, args.data_root, args.ood_root):
        chain.read(path)
    if args.output:
        chain.write(args.output)


def _predict(chain, argv):
    import predict

    args = predict.parse_args(argv)
    for path in (args.checkpoint, args.config, args.classes, args.images):
        chain.read(path)
    chain.write(args.output, exclusive=not args.overwrite)


def _export(chain, argv):
    import export
    from exporting.arguments import output_of

    args = export.parse_args(argv)
    chain.read(args.checkpoint)
    chain.read(args.config)
    is_dir = lambda p: not os.path.splitext(p)[1]  # noqa: E731  (a run or checkpoint folder, or a placeholder)
    with mock.patch.object(os.path, "isdir", is_dir):  # the chain's files, not this machine's
        output = output_of(args)
    chain.write(output, exclusive=not args.overwrite)


def _extract(chain, argv):
    import extract_features

    args = extract_features.parse_args(argv)
    for path in (args.checkpoint, args.config, args.data_root, args.ood_root):
        chain.read(path)
    chain.write(args.output, exclusive=True)


def _compare(chain, argv):
    from comparison import cli
    from comparison.plan import config_stem, plan_runs
    from comparison.report.write import report_dir_of

    with mock.patch.object(cli, "feature_overrides", lambda features, overrides: []):  # it opens the folder
        args = cli.parse_args(argv)
    chain.read(args.config)
    chain.read(args.features)
    chain.read(args.ood_root)
    cfg = chain.config(args.config, args.overrides)
    if cfg is not None and not args.features:
        chain.config_reads(cfg)
    plan, runs_dir = plan_runs(args)
    for _, _, run_dir, _ in plan:
        chain.write(run_dir)
    if args.tune:
        chain.write(os.path.join(runs_dir, "tune"))
    if args.storage and args.storage.startswith("journal:"):
        chain.write(args.storage[len("journal:"):])
    chain.write(report_dir_of(args, runs_dir, config_stem(args)))
    if args.emit_slurm:
        chain.write(args.emit_slurm)


def _onnx_predict(chain, argv):
    import onnx_predict

    seen = {}  # its parser is inside main: what main hands on is what it parsed
    predicting = lambda model, images, batch: seen.update(m=model, i=images) or []  # noqa: E731
    with mock.patch.object(onnx_predict, "predict", predicting), \
            mock.patch.object(onnx_predict, "write_output", lambda path, text: seen.update(o=path)):
        assert onnx_predict.main(argv) == 0
    for path in (seen["m"], *seen["i"]):
        chain.read(path)
    if seen.get("o"):
        chain.write(seen["o"])


SCRIPTS = {"train.py": _train, "eval.py": _eval, "predict.py": _predict, "scripts/export.py": _export,
           "scripts/extract_features.py": _extract, "scripts/compare_heads.py": _compare,
           "scripts/onnx_predict.py": _onnx_predict}


def run_line(chain, words):
    """One command of the page: its reads checked, its writes recorded."""
    if words[0] == "srun":
        words = words[1:]
    if words[:2] == ["accelerate", "launch"]:  # its own options, then the script
        words = ["python", *words[next(i for i, w in enumerate(words) if w.endswith(".py")):]]
    if words[0] == "make":
        for line in makefile_recipe(words[1]):
            run_line(chain, line.split())
    elif words[0] == "mkdir":
        for path in words[1:]:
            if not path.startswith("-"):
                chain.write(path)
    elif words[0] == "cp":  # cp [-r] SOURCE... DEST
        paths = [w for w in words[1:] if not w.startswith("-")]
        for path in paths[:-1]:
            chain.read(path)
        chain.write(paths[-1])
    elif words[0] == "python" and words[1] != "-m":
        script, argv = words[1], words[2:]
        if script in SCRIPTS:
            SCRIPTS[script](chain, argv)
        elif chain.placeholder(script):  # another project's script, e.g. timm's PATH/validate.py
            chain.generic(argv)
        else:
            assert script in chain.tracked, f"{chain.page}: `{chain.line}` runs {script}: no file of the repository"
            chain.generic(argv)
    elif words[0] == "sbatch":
        chain.read(words[-1])
    elif words[0] != "python":
        raise AssertionError(f"{chain.page}: `{chain.line}`: a command this test does not know; teach run_line")


def check_page(page, tracked):
    """The chain of `page`'s commands, in order after `make quickstart`: its problems, the placeholders used."""
    chain = Chain(page, tracked)
    chain.line = "make quickstart"
    run_line(chain, ["make", "quickstart"])
    for _, words in shell_commands(command_lines(page)):
        chain.line = shlex.join(words)
        said = io.StringIO()
        try:
            with contextlib.redirect_stderr(said):
                run_line(chain, words)
        except (UserError, SystemExit) as err:
            why = str(err) if isinstance(err, UserError) else said.getvalue().strip().splitlines()[-1]
            chain.problems.append(f"{page}: `{chain.line}` does not run as written: {why}")
    return chain


@pytest.fixture(scope="module")
def tracked():
    return set(tracked_files())


@pytest.mark.parametrize("page", pages())
def test_every_command_finds_what_it_reads(page, tracked):
    chain = check_page(page, tracked)
    assert not chain.problems, "\n".join(chain.problems)
    text = prose(page)
    for name in sorted(chain.placeholders):  # said in the text, as `RUN_DIR` or `photos/`
        assert re.search(rf"`[^`\n]*(?<![\w/]){re.escape(name)}(?![\w])[^`\n]*`", text), \
            f"{page}: its commands read {name}, which its text never names (say what the reader puts there)"
    for own in USER_FILES.get(page, ()):  # each declared one is read there, and is a user's
        assert os.path.normpath(own) in chain.placeholders and not own.startswith(MADE_BY_COMMANDS), (page, own)


def test_the_check_finds_a_read_nothing_made(tracked):
    """The check itself: a page reading a run no command on it trains is caught, and one that trains it
    first is not; so is a second training into one folder."""
    def problems(*lines):
        chain = Chain("docs/x.md", tracked)
        for _, words in shell_commands(lines):
            chain.line = shlex.join(words)
            run_line(chain, words)
        return chain.problems

    extract = "python scripts/extract_features.py --checkpoint runs/quickstart --output features/qs"
    assert "reads runs/quickstart, which no earlier command" in problems(extract)[0]
    assert problems("python train.py --config configs/quickstart.yaml", extract) == []
    assert "the second is refused" in problems(*["python train.py --config configs/quickstart.yaml"] * 2)[0]
    assert "reads features/qs" in problems("python scripts/compare_heads.py --config configs/quickstart.yaml "
                                           "--features features/qs --tune")[0]
    copy = "cp -r runs/quickstart runs/copy"  # cp reads its sources and writes its destination
    assert "reads runs/quickstart, which no earlier command" in problems(copy)[0]
    assert problems("python train.py --config configs/quickstart.yaml", copy,
                    "python scripts/extract_features.py --checkpoint runs/copy --output features/qs") == []


# ----------------------------------------------------------------------------- the tuning page, run
def test_the_tuning_pages_chain_runs_as_written(tmp_path, monkeypatch, capsys, one_thread):
    """docs/tuning.md's first block in order (train the source, extract its features, tune on them),
    each command as written with settings appended that shrink it to a second: 2 heads, 1 seed,
    1 trial, 1 epoch, 48 images of 16 px (later flags and overrides win)."""
    import compare_heads
    import extract_features
    import train
    from comparison.plan import config_stem
    from comparison.report import plots
    from test_run_sources import TINY
    from test_train_helpers import reset_accelerate_state

    commands = [argv for _, argv in shell_commands(command_lines("tuning.md", "Why"))]
    assert [c[:2] for c in commands] == [["python", "train.py"], ["python", "scripts/extract_features.py"],
                                          ["python", "scripts/compare_heads.py"]]
    shrink = {train: [*TINY, "data.builtin_train_size=48", "data.batch_size=16"],  # 2 batches besides calib
              extract_features: [],  # the run's own (tiny) data
              compare_heads: ["--heads", "softmax", "sparsemax", "--seeds", "0", "--trials", "1", "--no-mlflow", *TINY]}
    monkeypatch.chdir(tmp_path)
    os.symlink(os.path.join(ROOT, "configs"), "configs")
    for name in dir(plots):  # the report's figures are most of the comparison's time here: not drawn
        if name.startswith("plot_"):  # (their tests: tests/test_compare.py, tests/test_tune.py)
            monkeypatch.setattr(plots, name, lambda *args, **kwargs: None)
    for entry, command in zip(shrink, commands):
        reset_accelerate_state()
        assert entry.main(command[2:] + shrink[entry]) == 0, command
    capsys.readouterr()

    trained, extracted, tuned = (entry.parse_args(c[2:]) for entry, c in zip(shrink, commands))
    source = configs.load_config(trained.config, trained.overrides).train.output_dir
    assert (extracted.checkpoint, extracted.output) == (source, tuned.features)  # one chain, each on the last's output
    with open(os.path.join(tuned.features, "features.json")) as f:
        assert json.load(f)["source"]["path"] == source
    report = os.path.join("reports", config_stem(tuned))
    with open(os.path.join(report, "report.md")) as f:
        assert "## Tuning" in f.read()
    with open(os.path.join(report, "tuning.json")) as f:
        variants = json.load(f)["variants"]
    assert sorted(variants) == ["softmax", "sparsemax"]
    assert all([t["state"] for t in v["trials"]].count("COMPLETE") == 1 for v in variants.values())
    run = os.path.join("runs", "compare", config_stem(tuned), "tune", "tuned", "sparsemax-s0")
    saved = configs.load_run_config(run)
    assert (saved.data.dataset, saved.data.root) == ("features", tuned.features)
    with open(os.path.join(run, "eval.json")) as f:
        assert json.load(f)["ood"]["dataset"] == "features"  # the extraction's --ood auto, evaluated
