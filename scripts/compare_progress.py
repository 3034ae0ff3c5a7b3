"""How far a head comparison is and about how long the rest will take: one line after each run.

The estimate is the pace so far (wall time since the first run started over the runs finished
now) times the runs left, so it already accounts for --jobs N running several at once. Runs found
finished at the start are not counted: they took no time now.
"""
import threading
import time


def duration(seconds):
    """'45 s', '3 min 05 s', '1 h 02 min': short and readable in a progress line."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class Progress:
    """Counts the runs of a plan finished now; `line()` after each says done/total, elapsed, ETA."""

    def __init__(self, total, skipped=0, clock=time.perf_counter):
        self.total, self.skipped, self.clock = total, skipped, clock
        self.start, self.done = clock(), 0
        self._lock = threading.Lock()  # --jobs N: runs finish on several threads

    def line(self):
        """Count one more finished run; -> the progress line to print."""
        with self._lock:
            self.done += 1
            elapsed = self.clock() - self.start
            left = self.total - self.done
            finished = self.skipped + self.done
            whole = self.skipped + self.total
            eta = "" if not left else f"; about {duration(elapsed / self.done * left)} left at this pace"
            return f"progress: {finished} of {whole} run(s) finished ({self.done} now, in {duration(elapsed)}){eta}"
