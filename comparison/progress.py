"""How far a head comparison is and about how long the rest will take: one line after each run.

The estimate schedules what is left on the job slots (--jobs N) at the mean duration of the runs
finished now: each run in flight needs that duration less its age, each queued run takes the next
free slot, and the rest ends when the last slot does. (Wall time so far over the runs done, times
the runs left, ignores the slots: with 9 runs on 3 slots it said 8 run-lengths after the first run
where 2 were left.) Runs found finished at the start are not counted: they took no time now.
"""
import heapq
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


def time_left(run_s, ages, queued, slots):
    """When the last of the runs in flight (their `ages`) and `queued` more end, every run taking
    `run_s`, on `slots` slots (at least one per run in flight)."""
    free = sorted(max(run_s - age, 0.0) for age in ages) + [0.0] * max(slots - len(ages), 0)
    heapq.heapify(free)
    for _ in range(queued):
        heapq.heappush(free, heapq.heappop(free) + run_s)
    return max(free, default=0.0)


class Progress:
    """Counts the runs of a plan finished now; `started(key)` when a run starts on a slot, `line(key)`
    when it is done: done/total, elapsed, time left. Without `started` (one run after another), a
    run's duration is the time since the previous one ended."""

    def __init__(self, total, skipped=0, slots=1, clock=time.perf_counter):
        self.total, self.skipped, self.slots, self.clock = total, skipped, slots, clock
        self.start = self.last_end = clock()
        self.done, self.durations, self.running = 0, [], {}
        self._lock = threading.Lock()  # --jobs N: runs start and finish on several threads

    def started(self, key):
        with self._lock:
            self.running[key] = self.clock()

    def line(self, key=None):
        """Count one more finished run; -> the progress line to print."""
        with self._lock:
            now = self.clock()
            self.done += 1
            self.durations.append(now - self.running.pop(key, self.last_end))
            self.last_end = now
            left = self.total - self.done
            finished, whole = self.skipped + self.done, self.skipped + self.total
            text = f"progress: {finished} of {whole} run(s) finished ({self.done} now, in {duration(now - self.start)})"
            if not left:
                return text
            run_s = sum(self.durations) / len(self.durations)
            ages = [now - t for t in self.running.values()]
            rest = time_left(run_s, ages, left - len(ages), self.slots)
            return text + f"; about {duration(rest)} left ({self.slots} job slot(s), {len(ages)} run(s) in flight)"
