"""The plan of a comparison: its variants (head × norm × α), their runs (one per seed, each with its
run directory and overrides) and the pairs the report compares. One function of the arguments, the
same in every mode (sequential, --jobs, --emit-slurm, --report-only, --dry-run, --tune's arms)."""
import os

from common.errors import UserError
from configs.loader import suggest_value
from models.registry import HEAD_NAMES, check_settings


def variants(args):
    """[(variant name, variant stem without the norm, norm, head, alpha)] in plan order."""
    for head in args.heads:
        if head not in HEAD_NAMES:
            raise UserError(f"unknown head '{head}' in --heads; valid: {', '.join(HEAD_NAMES)}"
                            f"{suggest_value(head, HEAD_NAMES)}")
    if args.alphas and "entmax_bisect" not in args.heads:
        raise UserError("--alphas applies to entmax_bisect; add it to --heads")
    for a in args.alphas or ():
        try:
            check_settings("entmax_bisect", {"alpha": a, "learn_alpha": args.learn_alpha})
        except UserError as err:
            raise UserError(f"--alphas: {err}") from None
    out = []
    for norm in args.norms or [None]:
        for head in args.heads:
            for alpha in ((args.alphas or [None]) if head == "entmax_bisect" else [None]):
                stem = head + (f"-a{alpha:g}" if alpha is not None else "") \
                    + ("-learned" if head == "entmax_bisect" and args.learn_alpha else "")
                out.append((stem + (f"-{norm}" if norm else ""), stem, norm, head, alpha))
    return out


def config_stem(args):
    """The config's name (its file name without .yaml): the default runs and report folders' name."""
    return os.path.splitext(os.path.basename(args.config))[0]


def default_runs_dir(args):
    return args.runs_dir or os.path.join("runs", "compare", config_stem(args))


def variant_overrides(args, head, alpha, norm):
    """What a variant adds to the comparison's overrides (its head, alpha, norm)."""
    ov = [f"head.name={head}"]
    if alpha is not None:
        ov.append(f"head.alpha={alpha}")
    if head == "entmax_bisect" and args.learn_alpha:
        ov.append("head.learn_alpha=true")
    if norm:
        ov.append(f"model.norm={norm}")
    return ov


def plan_runs(args, runs_dir=None, extra=None):
    """[(variant name, seed, run_dir, overrides)] in the order they will run, and the runs folder.
    `extra`: {variant name: overrides it adds} (--tune: its tuned settings)."""
    runs_dir = runs_dir or default_runs_dir(args)
    plan = []
    for name, _, norm, head, alpha in variants(args):
        for seed in args.seeds:
            run_dir = os.path.join(runs_dir, f"{name}-s{seed}")
            ov = list(args.overrides) + (extra or {}).get(name, []) \
                + [f"head.name={head}", f"train.seed={seed}", f"train.output_dir={run_dir}"] \
                + variant_overrides(args, head, alpha, norm)[1:]
            plan.append((name, seed, run_dir, ov))
    return plan, runs_dir


def baseline_pairs(args):
    """[(variant, its baseline variant)]: every other variant against the baseline of the same norm."""
    found = variants(args)
    baseline = args.baseline
    if baseline is None:
        baseline = "softmax" if "softmax" in args.heads else found[0][1]
    stems = sorted({v[1] for v in found})
    if baseline not in stems:
        raise UserError(f"--baseline {baseline} is not among the compared variants; valid: {', '.join(stems)}")
    base_of = {norm: name for name, stem, norm, _, _ in found if stem == baseline}
    return [(name, base_of[norm]) for name, stem, norm, _, _ in found if stem != baseline]
