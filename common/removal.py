"""Deleting in a run directory: never through a link, and all or nothing.

`remove(path)` deletes one entry: a symlink (to a file or a folder) is unlinked itself and its
target never touched; a folder goes with its content, where links are unlinked again, never
followed (shutil.rmtree does not follow them).

`removal_blockers(paths)` says, before anything is deleted, why some of `paths` could not be: a
folder the kernel would not let us change (read-only filesystem, no write permission: os.access
checks both, as the unlink would) or a mount point inside (rmdir fails with EBUSY). `remove_all`
refuses in one line (WriteError, exit 74) while there is any, so a refusal leaves every path exactly
as it was.
"""
import os
import shutil

from .io import WriteError


def _why_unchangeable(folder):
    """Why entries of `folder` cannot be deleted, or None."""
    if os.access(folder, os.W_OK | os.X_OK):
        return None
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return f"{folder} is on a read-only filesystem"
    except OSError:
        pass
    return f"{folder} is not writable (permissions)"


def _folders_inside(path):
    """`path` and every folder below it, links not followed."""
    for folder, _, _ in os.walk(path, followlinks=False):
        yield folder


def removal_blockers(paths):
    """One line per reason some of `paths` cannot be deleted (empty: all of them can)."""
    problems = []
    for path in paths:
        if not os.path.lexists(path):
            continue
        why = _why_unchangeable(os.path.dirname(os.path.abspath(path)))
        if why is None and os.path.isdir(path) and not os.path.islink(path):
            for folder in _folders_inside(path):
                if os.path.ismount(folder):
                    why = f"{folder} is a mount point"
                else:
                    why = _why_unchangeable(folder)
                if why:
                    break
        if why and why not in problems:
            problems.append(why)
    return problems


def remove(path):
    """Delete `path`: a link or file is unlinked, a real folder removed with its content (links
    inside unlinked, never followed). Missing: nothing to do."""
    if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
        os.unlink(path)
    elif os.path.isdir(path):
        shutil.rmtree(path)


def remove_all(paths, *, why, before=None):
    """Delete every one of `paths` (see `remove`), after checking that all can be deleted; `why`
    names the operation in a refusal (e.g. '--overwrite'): WriteError (one line), nothing deleted.
    `before()` runs once the check has passed, just before the first deletion (to announce it)."""
    problems = removal_blockers(paths)
    if problems:
        raise WriteError(f"{why} cannot delete {', '.join(os.path.basename(p) for p in paths)}: "
                         f"{'; '.join(problems)}; nothing was deleted")
    if before is not None:
        before()
    for path in paths:
        try:
            remove(path)
        except OSError as err:
            raise WriteError(f"{why}: deleting {path} failed ({err.strerror or err}); the entries before it in "
                             f"{', '.join(os.path.basename(p) for p in paths)} are deleted") from None


def remove_quietly(path):
    """`remove`, ignoring errors (clean-up of temporary folders; a leftover is found again later)."""
    try:
        remove(path)
    except OSError:
        pass
