"""--emit-slurm: the plan as a SLURM array job, one task per planned run (the script is the template
comparison/slurm_array.sh, filled in here), and the check a task calls back before it evaluates."""
import os
import shlex
import sys

from common.errors import UserError
from common.io import atomic_write_text, writing
from comparison.paths import ROOT
from comparison.run_results import not_evaluated

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "slurm_array.sh")
SHEBANG = "#!/bin/bash"  # the template's notes end here: the script starts with it


def emit_slurm(path, plan, commands, stem, command, report_command):
    """Write the array job script: task i = plan[i] (train with its overrides, then evaluate).

    The tasks run in the repository root, as scripts/slurm_train.sh does (it starts train.py from
    there): the plan's relative paths mean the same only when compare_heads.py runs there too."""
    if os.path.realpath(os.getcwd()) != os.path.realpath(ROOT):
        raise UserError("--emit-slurm: run compare_heads.py from the repository root (the job runs "
                        "train.py there, as scripts/slurm_train.sh does, so relative run directories and "
                        "data roots must mean the same)")
    cases = []
    for i, (_, _, run_dir, ov) in enumerate(plan):
        cases.append(f"  {i}) RUN_DIR={shlex.quote(run_dir)}\n"
                     f"     TRAIN_OVERRIDES={_bash_array(ov)}\n"
                     f"     EVAL_ARGS={_bash_array(commands.eval_args(run_dir))};;")
    text = _template().format(
        stem=stem, n=len(plan), last=len(plan) - 1, command=command, script=path, report_command=report_command,
        repo=shlex.quote(ROOT), config=shlex.quote(commands.config),
        cases="\n".join(cases), eval_file=shlex.quote(commands.eval_file),
        ood_check=shlex.quote(commands.ood) if commands.ood else "")
    atomic_write_text(path, text)
    with writing(path):
        os.chmod(path, 0o755)


def _template():
    with open(TEMPLATE) as f:
        text = f.read()
    return text[text.index(SHEBANG):]


def _bash_array(words):
    return "(" + " ".join(shlex.quote(w) for w in words) + ")"


def report_only_argv(argv):
    """The same arguments with --emit-slurm FILE replaced by --report-only: the command the script
    says to run when its tasks are done."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == "--emit-slurm":
            skip = True
        elif not a.startswith("--emit-slurm="):
            out.append(a)
    return out + ["--report-only"]


def check_evaluated(argv):
    """`compare_heads.py --check-evaluated RUN_DIR EVAL_FILE [OOD]`: exit 0 when evaluated (for the
    array task, which evaluates otherwise; the same rule as the local modes). A damaged or foreign
    evaluation is said in the task's log before it is redone."""
    run_dir, eval_file = argv[0], argv[1]
    why = not_evaluated(run_dir, eval_file, argv[2] if len(argv) > 2 else None)
    if why is not None and why.damaged:
        print(f"{why.reason}; evaluating it again", file=sys.stderr, flush=True)
    return 0 if why is None else 1
