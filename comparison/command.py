"""The comparison command from its parsed arguments and the config they resolve to (checked by
comparison.cli before torch loads: a bad config or override fails before anything runs), the
commands of every run, then one plan through its mode, --tune's studies and both of its arms,
--until-settled's looks, or both: the studies, then the looks of the tuned heads."""
import os

import data
from common.errors import UserError
from comparison import tune, tune_settle
from comparison.commands import Commands
from comparison.modes import compare_plan, compare_until_settled
from comparison.plan import plan_runs
from data import dataset_spec, is_features
from data.features import ood_root
from evaluation.ood_report import default_ood_dataset, ood_data, ood_dataset_names


def run(args, argv, base_cfg):
    """-> the exit status. `argv`: the command line as given (the report and SLURM script quote it);
    `base_cfg`: the config resolved with the overrides (comparison.cli.resolved_config)."""
    ood = resolve_ood(args, base_cfg)
    check_ood_data(args, base_cfg, ood)
    commands = Commands(args, os.path.abspath(args.config), ood)
    if args.tune and args.until_settled:
        return tune_settle.main(args, argv, base_cfg, commands)
    if args.tune:
        return tune.main(args, argv, base_cfg, commands)
    if args.until_settled:
        return compare_until_settled(args, argv, commands)
    plan, runs_dir = plan_runs(args)
    compare_plan(args, argv, plan, runs_dir, commands)
    return 0


def resolve_ood(args, cfg):
    """The OOD dataset name eval.py gets (None: no OOD detection)."""
    if args.ood_dataset == "none":
        return None
    if is_features(cfg.data):
        return _feature_ood(args, cfg)
    if args.ood_dataset == "auto":
        return default_ood_dataset(cfg.data.dataset)
    if args.ood_dataset not in ood_dataset_names():
        raise UserError(f"unknown --ood-dataset '{args.ood_dataset}'; valid: auto, none, "
                        f"{', '.join(ood_dataset_names())}")
    return args.ood_dataset


def check_ood_data(args, cfg, ood):
    """Read the OOD set's val split once, before anything trains, when its files will be read here:
    missing files (or a failed download) are one line now, not after the trainings (eval.py reads it
    after each). Not for generated sets, nor where nothing is evaluated here (--dry-run, --report-only,
    --emit-slurm: the cluster has its own files)."""
    if (ood in (None, "features") or not dataset_spec(ood).files or args.dry_run or args.report_only
            or args.emit_slurm):
        return
    try:
        data.build_dataset(ood_data(cfg.data, ood, args.ood_root), "val")
    except UserError as err:
        named = ood if args.ood_dataset == ood else f"{args.ood_dataset} ({ood})"
        raise UserError(f"--ood-dataset {named}, read by every evaluation: {err}; or rewrite the report of runs "
                        f"already evaluated: --report-only; or compare without OOD detection: --ood-dataset none"
                        ) from None


def _feature_ood(args, cfg):
    """On cached features the OOD set is OOD features: the folder's own (DIR/ood) or --ood-root's."""
    if args.ood_dataset not in ("auto", "features"):
        raise UserError(f"--ood-dataset {args.ood_dataset}: on cached features the OOD set is OOD features; use "
                        f"auto (DIR/ood, scripts/extract_features.py --ood NAME), features with --ood-root DIR, "
                        f"or none")
    if args.ood_root is None and ood_root(cfg.data.root) is None:
        if args.ood_dataset == "auto":
            return None
        raise UserError(f"--ood-dataset features: {cfg.data.root} holds no OOD features; extract them with "
                        f"scripts/extract_features.py --ood NAME, or give --ood-root OOD_FEATURE_DIR")
    return "features"
