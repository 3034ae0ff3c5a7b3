"""Graceful preemption: a signal asks the training to save a checkpoint and stop.

SIGTERM (SLURM/Kubernetes before preemption), SIGINT (Ctrl-C) and SIGUSR1 (SLURM's
`--signal=B:USR1@<grace>` forwarded by scripts/slurm_train.sh) only set a flag. The training loop
asks `guard.should_stop(step, reduce_max)` at step boundaries; once every rank agrees it saves a
complete checkpoint, calls `guard.mark_saved()` and exits with the signal's code.

A second signal exits at once, without saving. Copies of ONE signal often arrive twice within
milliseconds (SLURM and Kubernetes signal every process of the job, and `accelerate launch`'s
torch elastic agent forwards the signal it got to its workers; Ctrl-C reaches the whole foreground
process group), so a repeat within `debounce_s` (default 2 s) of the first is ignored. After
`mark_saved()`, a further signal raises SystemExit with the graceful code (cleanup and the run
lock's release still run): the checkpoint is already complete.

Processes forked after `install()` (DataLoader workers) inherit the handler; in them it does
nothing, the main process decides (the loader stops its workers when the run ends).

Exit codes (the shell convention 128 + signal number, so schedulers and `$?` read them as usual):
    143  SIGTERM received; a checkpoint was saved, then the run stopped   (EXIT_CODES[SIGTERM])
    130  SIGINT  received; same                                          (EXIT_CODES[SIGINT])
    138  SIGUSR1 received; same                                          (EXIT_CODES[SIGUSR1])
    137  a second signal arrived before the save finished: exited at once, nothing saved after the
         previous checkpoint (EXIT_FORCED: the code of a SIGKILL, which is what it amounts to;
         the run lock is left behind and taken over as stale by the next run)
`--resume auto` continues from the newest checkpoint after any of them.

Agreement across ranks (every rank must save at the same step, or the collectives of the save
deadlock): ranks see a signal at different moments, so the local flag alone never decides. Every
`sync_every` steps each rank contributes its flag to ONE max-reduction and all stop if any was
signalled. That collective plus reading its result on the host is a synchronisation point, so it
is not done every step: use the log cadence (the loop already syncs there for the loss) or pass a
reduction on a CPU (gloo) process group, which never waits for the GPU (`gloo_reduce_max`). With
one process there is no collective at all and the flag is read directly (a Python bool).

    guard = PreemptionGuard(sync_every=cfg.train.log_every).install()   # main thread, once
    reduce_max = None if world == 1 else gloo_reduce_max(gloo_group)
    ...
    if guard.should_stop(step, reduce_max):         # at a step boundary, on every rank
        save_checkpoint(...)
        guard.mark_saved()
        return guard.exit_code

Grace period: the signal must come early enough for up to `sync_every` more steps plus one save
(see scripts/slurm_train.sh for measured save times).
"""
import os
import signal
import time

from common.signal_handlers import DEBOUNCE_S, HANDLED_SIGNALS, SignalHandlers

EXIT_CODES = {signal.SIGTERM: 143, signal.SIGINT: 130, signal.SIGUSR1: 138}
EXIT_FORCED = 137


class PreemptionGuard(SignalHandlers):
    """Turns the first SIGTERM/SIGINT/SIGUSR1 into a stop request; a second one exits at once.

    Attributes: `requested` (bool, this process got a signal), `signum` (the first signal),
    `exit_code` (for the first signal, 143/130/138; 0 when none), `stopping` (True once
    `should_stop` said yes)."""

    def __init__(self, sync_every=1, signals=HANDLED_SIGNALS, debounce_s=DEBOUNCE_S, stream_fd=2):
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.sync_every = int(sync_every)
        self.signals = tuple(signals)
        self.debounce_s = float(debounce_s)
        self.stream_fd = stream_fd
        self.requested = False
        self.signum = None
        self.stopping = False
        self.saved = False
        self._first_at = None
        self._pid = None
        self._previous = {}

    # -------------------------------------------------------------- signal handling
    def _say(self, text):
        try:  # os.write, not print: a handler may interrupt a print in progress
            os.write(self.stream_fd, (text + "\n").encode())
        except OSError:
            pass

    def _handle(self, signum, frame):
        if os.getpid() != self._pid:  # a forked child (DataLoader worker): the main process decides
            return
        name = signal.Signals(signum).name
        if self.requested:
            if time.monotonic() - self._first_at < self.debounce_s:
                return  # the same signal delivered twice (scheduler + launcher), not a second request
            if self.saved:
                self._say(f"{name} again: the checkpoint is saved, exiting with {self.exit_code}")
                raise SystemExit(self.exit_code)
            self._say(f"{name} again: exiting at once without saving (exit {EXIT_FORCED})")
            os._exit(EXIT_FORCED)
        self.requested, self.signum, self._first_at = True, signum, time.monotonic()
        self._say(f"{name} received: saving a checkpoint at the next step boundary, then exiting with "
                  f"{EXIT_CODES.get(signum, 128 + signum)} (send it again to exit at once without saving)")

    def install(self):
        self._pid = os.getpid()
        return super().install()

    # -------------------------------------------------------------- decision
    @property
    def exit_code(self):
        if self.signum is None:
            return 0
        return EXIT_CODES.get(self.signum, 128 + self.signum)

    def mark_saved(self):
        """Call once the preemption checkpoint is complete: later signals exit gracefully."""
        self.saved = True

    def should_stop(self, step, reduce_max=None, force_sync=False):
        """Whether all ranks stop after `step` (call it at a step boundary on every rank).

        `reduce_max`: None for one process (no collective; the local flag decides at once), else a
        callable int -> int returning the maximum of its argument over all ranks (one collective),
        called only when `step % sync_every == 0` so every rank calls it at the same steps, or
        when `force_sync` (e.g. right after an epoch-end checkpoint, where every rank passes too)."""
        if self.stopping:
            return True
        if reduce_max is None:
            self.stopping = self.requested
        elif force_sync or step % self.sync_every == 0:
            agreed = int(reduce_max(1 if self.requested else 0))
            if agreed and not self.requested:  # another rank was signalled: stop like a SIGTERM
                self.requested, self.signum, self._first_at = True, signal.SIGTERM, time.monotonic()
            self.stopping = bool(agreed)
        return self.stopping


def gloo_reduce_max(group=None):
    """A `reduce_max` for `PreemptionGuard.should_stop` that all-reduces a CPU int64 over
    `group` (create one with `torch.distributed.new_group(backend="gloo")` on every rank, once):
    the host never waits for the GPU stream. Requires torch.distributed to be initialised."""
    # heavy: torch (seconds), only where ranks reduce: a one-process guard never loads it
    import torch
    import torch.distributed as dist

    def reduce_max(flag):
        t = torch.tensor([int(flag)], dtype=torch.int64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return int(t.item())  # a CPU tensor: no device synchronisation

    return reduce_max

