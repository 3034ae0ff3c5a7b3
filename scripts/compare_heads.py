"""Compare output heads: train every missing run, evaluate each, write a report with plots.

    python scripts/compare_heads.py --config configs/quickstart_compare.yaml \\
        --heads softmax sparsemax entmax15 [--norms affine layernorm] [--alphas 1.25 1.75] \\
        [--seeds 0 1 2] [--runs-dir runs/compare] [--report-dir reports/compare] [key.sub=value ...]

For each variant (head × norm × α) and seed the run directory is RUNS_DIR/<variant>-s<seed>.
Training and evaluation go through the two entry points the same way, as subprocesses, one run
after another:
`python train.py --config CFG <overrides> head.name=.. train.seed=.. train.output_dir=.. --resume auto`
`python eval.py --checkpoint RUN_DIR --output RUN_DIR/eval.json --quiet`
(both prefixed with --launcher, e.g. "accelerate launch --num_processes 8", when given). Both are
subprocesses because Accelerate's state (process group, device, mixed precision) is per process and
a multi-process launcher needs a fresh one anyway; it costs one Python start-up per evaluation.
Resumable: a run with summary.json is complete and skipped; an interrupted one continues from its
last checkpoint (--resume auto); a run evaluated already (eval.json and its per-example records,
eval.examples.safetensors) is not evaluated again. So a second invocation trains and evaluates
nothing and only rewrites the report.
Report (REPORT_DIR): report.md (mean ± std over seeds of every metric, training time, img/s),
runs.csv, summary.csv and val_accuracy.png, support_hist.png, reliability.png,
coverage_vs_set_size.png.
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from engine.cli import run_cli  # noqa: E402
from common.errors import UserError  # noqa: E402
from common.io import json_text, write_json  # noqa: E402
from engine.runlock import RunLock  # noqa: E402

REQUEST_FILE = "compare_request.json"  # what this script asked train.py for, to detect clashes


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                epilog="Extra key.sub=value arguments override the config of every run.",
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="base training config (YAML)")
    p.add_argument("--heads", nargs="+", default=["softmax", "sparsemax", "entmax15"],
                   help="output heads to compare (softmax sparsemax entmax15 entmax_bisect)")
    p.add_argument("--norms", nargs="+", default=None, help="also vary model.norm (affine layernorm batchnorm)")
    p.add_argument("--alphas", nargs="+", type=float, default=None,
                   help="alpha values for entmax_bisect (one variant each)")
    p.add_argument("--learn-alpha", action="store_true", help="entmax_bisect variants learn alpha")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--runs-dir", default=None, help="where the runs go (default runs/compare/<config name>)")
    p.add_argument("--report-dir", default=None, help="report folder (default reports/<config name>)")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights instead of the raw ones")
    p.add_argument("--launcher", default=None,
                   help='command prefix for train.py and eval.py, e.g. "accelerate launch --num_processes 2"')
    p.add_argument("--dry-run", action="store_true", help="list what would run, run nothing")
    args, rest = p.parse_known_args(argv)
    bad = [r for r in rest if "=" not in r or r.startswith("-")]
    if bad:
        raise UserError(f"unexpected argument '{bad[0]}': overrides look like key.sub=value; see --help")
    args.overrides = rest
    return args


def plan_runs(args):
    """[(variant name, seed, run_dir, overrides)] in the order they will run."""
    from configs.loader import check_alpha
    from models.heads import HEAD_NAMES

    for head in args.heads:
        if head not in HEAD_NAMES:
            raise UserError(f"unknown head '{head}' in --heads; valid: {', '.join(HEAD_NAMES)}")
    if args.alphas and "entmax_bisect" not in args.heads:
        raise UserError("--alphas applies to entmax_bisect; add it to --heads")
    for a in args.alphas or ():
        check_alpha(a, args.learn_alpha, "--alphas")
    stem = os.path.splitext(os.path.basename(args.config))[0]
    runs_dir = args.runs_dir or os.path.join("runs", "compare", stem)
    plan = []
    norms = args.norms or [None]
    for norm in norms:
        for head in args.heads:
            alphas = (args.alphas or [None]) if head == "entmax_bisect" else [None]
            for alpha in alphas:
                name = head + (f"-a{alpha:g}" if alpha is not None else "") \
                    + ("-learned" if head == "entmax_bisect" and args.learn_alpha else "") \
                    + (f"-{norm}" if norm else "")
                for seed in args.seeds:
                    run_dir = os.path.join(runs_dir, f"{name}-s{seed}")
                    ov = list(args.overrides) + [f"head.name={head}", f"train.seed={seed}",
                                                 f"train.output_dir={run_dir}"]
                    if alpha is not None:
                        ov.append(f"head.alpha={alpha}")
                    if head == "entmax_bisect" and args.learn_alpha:
                        ov.append("head.learn_alpha=true")
                    if norm:
                        ov.append(f"model.norm={norm}")
                    plan.append((name, seed, run_dir, ov))
    return plan, runs_dir


def _first_difference(old, new, prefix=""):
    """'optim.lr: 0.004 -> 0.002' for the first differing leaf of two nested dicts."""
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            diff = _first_difference(a, b, f"{prefix}{key}.")
            if diff:
                return diff
        elif a != b:
            return f"{prefix}{key}: {a!r} -> {b!r}"
    return None


def _check_request(run_dir, request, create=True):
    """Refuse to mix a run trained with other settings (overrides or config contents) into this
    comparison; record the request when the run is first started."""
    path = os.path.join(run_dir, REQUEST_FILE)
    request = json.loads(json_text(request))  # tuples -> lists, as stored
    if os.path.isfile(path):
        with open(path) as f:
            previous = json.load(f)
        if previous != request:
            diff = _first_difference(previous.get("resolved", {}), request.get("resolved", {})) \
                or " ".join(previous.get("overrides", []))
            raise UserError(f"{run_dir} was trained with other settings ({diff}); "
                            f"use another --runs-dir or delete that run")
    elif create:
        with RunLock(run_dir, purpose="compare_heads"):  # not while another process trains or evaluates there
            write_json(request, path)


def _run(cmd, what):
    print(f"$ {' '.join(shlex.quote(c) for c in cmd)}", flush=True)
    status = subprocess.call(cmd)  # in the caller's directory: relative run paths mean the same
    if status != 0:
        raise UserError(f"{what} failed (exit {status}); fix the error above and rerun the same command "
                        f"(finished runs are kept, interrupted ones resume)")


def main(argv=None):
    args = parse_args(argv)
    import configs

    config = os.path.abspath(args.config)
    configs.load_config(config, args.overrides)  # fail fast on a bad config / override
    plan, runs_dir = plan_runs(args)
    launcher = shlex.split(args.launcher) if args.launcher else [sys.executable]
    if args.launcher and not any(os.path.basename(c).startswith("python") for c in launcher) \
            and "launch" not in launcher:
        raise UserError(f"--launcher '{args.launcher}' should end in a Python launcher "
                        f"(e.g. 'accelerate launch --num_processes 2' or 'python')")
    eval_file = "eval_ema.json" if args.ema else "eval.json"
    start = time.perf_counter()
    trained, evaluated = run_plan(plan, args, config, launcher, eval_file)
    if args.dry_run:
        return 0
    table, path = write_comparison_report(plan, args, argv, eval_file)
    print()
    print(table)
    print()
    print(f"{trained} training run(s) and {evaluated} evaluation(s) done now in "
          f"{time.perf_counter() - start:.0f}s; {len(plan)} run(s) in {runs_dir}")
    print(f"report: {path}")
    return 0


def run_plan(plan, args, config, launcher, eval_file):
    """Train what is not trained and evaluate what is not evaluated; -> (trained, evaluated) counts."""
    import configs
    from evaluation.examples import examples_path

    trained = evaluated = 0
    for i, (name, seed, run_dir, ov) in enumerate(plan, 1):
        tag = f"[{i}/{len(plan)}] {name} seed {seed}"
        request = {"config": config, "overrides": ov,
                   "resolved": configs.config_to_dict(configs.load_config(config, ov))}
        _check_request(run_dir, request, create=False)  # also for finished runs: no stale reuse
        done_train = os.path.isfile(os.path.join(run_dir, "summary.json"))
        done_eval = all(os.path.isfile(p) for p in (os.path.join(run_dir, eval_file),
                                                     examples_path(os.path.join(run_dir, eval_file))))
        if done_train and done_eval:
            print(f"{tag}: done, skipped ({run_dir})", flush=True)
            continue
        if args.dry_run:
            print(f"{tag}: would {'evaluate' if done_train else 'train and evaluate'} {run_dir}")
            continue
        _check_request(run_dir, request)
        if not done_train:
            print(f"{tag}: training", flush=True)
            _run(launcher + [os.path.join(ROOT, "train.py"), "--config", config, *ov, "--resume", "auto"],
                 f"training {run_dir}")
            trained += 1
            if not os.path.isfile(os.path.join(run_dir, "summary.json")):
                raise UserError(f"train.py finished without writing {run_dir}/summary.json")
        print(f"{tag}: evaluating", flush=True)
        _run(launcher + [os.path.join(ROOT, "eval.py"), "--checkpoint", run_dir, "--output",
                         os.path.join(run_dir, eval_file), "--quiet"] + (["--ema"] if args.ema else []),
             f"evaluating {run_dir}")
        evaluated += 1
    return trained, evaluated


def write_comparison_report(plan, args, argv, eval_file):
    """Load every run's results and write the report; -> (table text, report.md path)."""
    from evaluation import comparison

    weights = "ema" if args.ema else "raw"
    variants = {}
    for name, seed, run_dir, _ in plan:
        variants.setdefault(name, []).append(comparison.load_run(run_dir, eval_file, weights=weights))
    stem = os.path.splitext(os.path.basename(args.config))[0]
    command = "python scripts/compare_heads.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    calib = (variants[plan[0][0]][0]["result"].get("prediction_sets") or {}).get("calibration") or {}
    notes = [calib["note"]] if calib.get("note") else []
    report_dir = args.report_dir or os.path.join("reports", stem)
    with RunLock(report_dir, purpose="compare_heads report"):  # one writer of the report folder
        return comparison.write_report(variants, report_dir, f"Head comparison: {stem}", command, weights=weights,
                                       notes=notes)


if __name__ == "__main__":
    run_cli(main)
