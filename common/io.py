"""Atomic text writes: a reader, or a run resumed after a kill, sees the old file or the new one,
never half of one (temp file in the same folder, fsync, os.replace)."""
import os


def atomic_write_text(path, text):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
