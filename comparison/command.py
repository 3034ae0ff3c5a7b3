"""The comparison command from its parsed arguments and the config they resolve to (checked by
comparison.cli before torch loads: a bad config or override fails before anything runs), the
commands of every run, then one plan through its mode, --tune's studies and both of its arms, or
--until-settled's looks."""
import os

from comparison import tune
from comparison.commands import Commands, resolve_ood
from comparison.modes import compare_plan, compare_until_settled
from comparison.plan import plan_runs


def run(args, argv, base_cfg):
    """-> the exit status. `argv`: the command line as given (the report and SLURM script quote it);
    `base_cfg`: the config resolved with the overrides (comparison.cli.resolved_config)."""
    commands = Commands(args, os.path.abspath(args.config), resolve_ood(args, base_cfg))
    if args.tune:
        return tune.main(args, argv, base_cfg, commands)
    if args.until_settled:
        return compare_until_settled(args, argv, commands)
    plan, runs_dir = plan_runs(args)
    compare_plan(args, argv, plan, runs_dir, commands)
    return 0
