"""A child process run as another user, for the checks that root would pass whatever the permissions
(os.access and open() say yes to root on a read-only folder): `as_nobody` drops the child to `nobody`,
and `unreachable` says what that user cannot reach of this interpreter and the project, so that such a
test skips, saying why, where it could not even start (a root user's venv under /root, mode 700, as in
many containers) instead of failing."""
import os
import subprocess
import sys

import pytest

NOBODY = 65534  # uid and gid of `nobody`

# As that user: a folder must be listable and enterable, a file readable (the interpreter: runnable).
_CHECK = ('for p; do kind=${p%%:*}; p=${p#*:}; '
          'case $kind in d) [ -r "$p" ] && [ -x "$p" ];; x) [ -x "$p" ];; *) [ -r "$p" ];; esac '
          '|| { echo "$p"; exit 1; }; done')


def as_nobody():
    """subprocess' preexec_fn: the child runs as `nobody` (no supplementary groups, root's included)."""
    os.setgroups([])
    os.setgid(NOBODY)
    os.setuid(NOBODY)


def unreachable(paths, preexec_fn=as_nobody):
    """The first of `paths` the user that `preexec_fn` switches to cannot reach (checked by that user's own
    shell, so every folder above it counts), or None. A path is 'x:PATH' (must run), 'd:PATH' (a folder)
    or 'r:PATH' (must read)."""
    done = subprocess.run(["/bin/sh", "-c", _CHECK, "sh", *paths], preexec_fn=preexec_fn, capture_output=True,
                          text=True, timeout=60)
    return (done.stdout.strip() or "?") if done.returncode else None


def skip_unless_nobody_can_run_python(root, modules=()):
    """pytest.skip, saying why, unless `nobody` can run this interpreter on the project at `root` and import
    `modules` (the third-party packages the child needs): the interpreter and the project are checked by
    nobody's shell, then a Python started as nobody imports them (its standard library and packages may
    lie elsewhere than root's: a venv's home under /root falls back to the system's)."""
    where = unreachable([f"x:{sys.executable}", f"d:{root}"])
    why = f"cannot reach {where}" if where else None
    if why is None:
        done = subprocess.run([sys.executable, "-c", f"import {', '.join(modules) or 'sys'}"], preexec_fn=as_nobody,
                              cwd="/", capture_output=True, text=True, timeout=120)
        lines = done.stderr.strip().splitlines() or ["no output"]
        why = f"cannot start this Python with {', '.join(modules) or 'its standard library'} ({lines[-1]})" \
            if done.returncode else None
    if why:
        pytest.skip(f"the check runs a Python as nobody (root passes any permission check), and nobody {why}: "
                    f"put the venv and the checkout where other users may enter, or run the tests as another "
                    f"user than root")
