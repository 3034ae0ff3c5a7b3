"""Run-directory logs written by the main process: metrics.jsonl, epochs.csv, console lines, the progress bar.

Resume safety: `truncate_after(step)` drops every row logged after the checkpoint's step, so a
resumed run re-logs those steps exactly once (no duplicated or missing step in metrics.jsonl).
"""
import csv
import io
import json
import os
import sys
import time

from tqdm import tqdm

from common import rundir
from common.io import atomic_write_text, json_text, writing

WALL_TIME = "wall_time"  # epochs.csv: when the row was written (Unix seconds), each point's time in a tracker


def _rewrite(path, lines):
    atomic_write_text(path, "".join(lines))


def _row_at_or_before(line, step):
    try:
        row = json.loads(line)
    except ValueError:  # a line cut by a kill mid-write
        return False
    return isinstance(row, dict) and row.get("step", 0) <= step


class MetricsLog:
    """Append-only JSON-lines log (one object per logged step and per eval; NaN written as null)."""

    def __init__(self, run_dir, enabled=True):
        self.path = os.path.join(run_dir, rundir.METRICS)
        self.enabled = enabled

    def write(self, **row):
        if not self.enabled:
            return
        with writing(self.path), open(self.path, "a") as f:  # appended: a line cut by a kill is skipped on read
            f.write(json_text(row) + "\n")
            f.flush()

    def truncate_after(self, step):
        """Drop the rows after `step` and the lines cut by a kill; the file is rewritten only when one goes."""
        if not self.enabled or not os.path.exists(self.path):
            return
        with open(self.path) as f:
            lines = f.readlines()
        keep = [line if line.endswith("\n") else line + "\n" for line in lines if _row_at_or_before(line, step)]
        if keep != lines:
            _rewrite(self.path, keep)


class EpochCSV:
    """One row per epoch: counters, train loss/lr/throughput and the epoch's eval metrics."""

    def __init__(self, run_dir, enabled=True):
        self.path = os.path.join(run_dir, rundir.EPOCHS)
        self.enabled = enabled

    def write(self, row):
        if not self.enabled:
            return
        rows = self.read()
        fields = list(rows[0].keys()) if rows else []
        row = {**row, WALL_TIME: round(time.time(), 3)}  # when the epoch and its evaluation were done
        fields += [k for k in row if k not in fields]
        rows.append(row)  # csv writes NaN as nan
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=fields, restval="")
        writer.writeheader()
        writer.writerows(rows)
        _rewrite(self.path, [buf.getvalue()])

    def read(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path, newline="") as f:
            return list(csv.DictReader(f))

    def reset(self):
        if self.enabled and os.path.exists(self.path):
            os.remove(self.path)

    def truncate_after(self, step):
        """Drop the rows after `step`; the file is rewritten only when one goes."""
        if not self.enabled:
            return
        rows = self.read()
        if all(int(r.get("step") or 0) <= step for r in rows):
            return
        rows = [r for r in rows if int(r.get("step") or 0) <= step]
        if not rows:
            self.reset()
            return
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=list(rows[0].keys()), restval="")
        writer.writeheader()
        writer.writerows(rows)
        _rewrite(self.path, [buf.getvalue()])


class ProgressBar(tqdm):
    """tqdm with one addition: `restart_clock`."""

    def restart_clock(self):
        """Count the rate and the ETA from here on, at the same position (the training loop calls it
        after its warm-up updates, whose compilation time would skew both)."""
        n = self.n
        self.reset(total=self.total)  # resets the position to 0 along with the clock
        self.initial = self.n = self.last_print_n = n


def progress_bar(total, initial=0, enabled=True, unit="step"):
    """The training bar on stdout, on a terminal only (tqdm's disable=None). Redirected to a file (a
    compare_heads log, a batch job), every console line written through `tqdm.write` would print the
    bar again after it (the final bar 2-3 times), and the \r updates are noise there; the epoch lines
    still report progress."""
    return ProgressBar(total=total, initial=initial, unit=unit, disable=None if enabled else True,
                       dynamic_ncols=True, file=sys.stdout)


def console(msg, enabled=True):
    """Print a line on the main process without breaking the tqdm bar."""
    if not enabled:
        return
    tqdm.write(msg, file=sys.stdout)
    sys.stdout.flush()


def format_throughput(images_per_s):
    """'123 img/s', or '4.2 s/img' under 1 img/s (a slow run would otherwise read '0 img/s')."""
    if images_per_s >= 1 or images_per_s <= 0:
        return f"{images_per_s:.0f} img/s"
    return f"{1 / images_per_s:.1f} s/img"


def format_eval(metrics):
    if not metrics.get("n", 1):
        return "no images evaluated (n=0): metrics null"
    return (f"top1 {100 * metrics['top1']:.2f}%  top5 {100 * metrics['top5']:.2f}%  "
            f"loss {metrics['loss']:.4f}  support {metrics['support_size']:.2f}")
