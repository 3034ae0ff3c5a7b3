"""How far a step that can take tens of seconds is (eval.py's passes over a split, its OOD feature
memory): the project's bar (training.logging.progress_bar, tqdm) on a terminal; in a log or a pipe,
where that bar stays silent, a plain line now and then on the same stream (stdout):

    building the OOD feature memory (1281167 training images): 40% (4004 of 10010 batches in 00:25; about 00:37 left)
    building the OOD feature memory (1281167 training images): done, 10010 batches in 01:02

A line is due at the next 10% once 10 s have passed since the last one, and after 60 s whatever the
share: a 60 s step gets about five lines, an hour's a line a minute, a step under 10 s none. A step
that printed any ends with one line saying it finished (`close`). `update` takes a host count (one
per batch, from the batch loop) and reads the clock: no device read.
"""
import sys
import time

from tqdm import tqdm

from training.logging import progress_bar

MARK_PERCENT = 10  # a line at each 10% ...
MIN_GAP_S = 10.0  # ... once this long after the last line (or the start)
MAX_GAP_S = 60.0  # and after this long in any case


def _clock_time(seconds):
    """'00:25', '01:02', '1:02:03': the bar's own notation (tqdm), in the lines too."""
    return tqdm.format_interval(seconds)


def on_terminal(stream):
    return bool(getattr(stream, "isatty", lambda: False)())


class LogLines:
    """The plain lines of a step of `total` batches (update(n) after each n)."""

    def __init__(self, total, what, clock=time.perf_counter):
        self.total, self.what, self.clock = int(total), what, clock
        self.start = self.last = clock()
        self.done, self.last_mark, self.printed = 0, 0, False

    def update(self, n=1):
        self.done += n
        now = self.clock()
        since = now - self.last
        if since < MIN_GAP_S or self.done >= self.total:  # the last batch: close() says it is done
            return
        mark = self.done * 100 // (MARK_PERCENT * self.total) if self.total > 0 else 0
        if mark > self.last_mark or since >= MAX_GAP_S:
            self.last, self.last_mark = now, mark
            self._say(self.line(now))

    def line(self, now):
        elapsed = now - self.start
        share = f"{100 * self.done // self.total}% " if self.total > 0 else ""
        text = f"{self.what}: {share}({self.done} of {self.total} batches in {_clock_time(elapsed)}"
        if 0 < self.done < self.total:
            text += f"; about {_clock_time(elapsed * (self.total - self.done) / self.done)} left"
        return text + ")"

    def close(self):
        if self.printed:
            self._say(f"{self.what}: done, {self.done} batches in {_clock_time(self.clock() - self.start)}")

    def _say(self, text):
        print(text, file=sys.stdout, flush=True)
        self.printed = True


def step_progress(total, what, *, enabled=True):
    """The progress of one step of `total` batches: the bar on a terminal, LogLines elsewhere,
    nothing where not `enabled` (the other ranks); each has update(n) and close()."""
    if enabled and not on_terminal(sys.stdout):
        return LogLines(total, what)
    bar = progress_bar(total, enabled=enabled, unit="batch")
    bar.set_description(what)  # drawn now: the first batch may take seconds
    return bar
