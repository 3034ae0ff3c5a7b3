"""The comparison command from its parsed arguments: the config resolved once (a bad config or
override fails before anything runs), the commands of every run, then one plan through its mode,
--tune's studies and both of its arms, or --until-settled's looks."""
import os

from comparison import tune
from comparison.commands import Commands, resolve_ood
from comparison.modes import compare_plan, compare_until_settled
from comparison.plan import plan_runs


def run(args, argv):
    """-> the exit status. `argv`: the command line as given (the report and SLURM script quote it)."""
    import configs

    config = os.path.abspath(args.config)
    base_cfg = configs.load_config(config, args.overrides)  # fail fast on a bad config / override
    commands = Commands(args, config, resolve_ood(args, base_cfg))
    if args.tune:
        return tune.main(args, argv, base_cfg, commands)
    if args.until_settled:
        return compare_until_settled(args, argv, commands)
    plan, runs_dir = plan_runs(args)
    compare_plan(args, argv, plan, runs_dir, commands)
    return 0
