"""The signals a run and its launchers act on, and the install/restore of their handlers.

training/preemption.py (train.py: save, then exit) and common/children.py (launchers: forward to the
children, wait for their saves) handle the same signals with the same debounce, each through its
own `_handle`; this is the part they share.
"""
import signal
import threading

# SLURM/Kubernetes preemption, Ctrl-C, and scripts/slurm_train.sh's pre-timeout signal.
HANDLED_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
# A repeat within this many seconds of the first signal is the same request (a terminal's Ctrl-C
# reaches a whole process group, SLURM may signal twice); a later one is a second request.
DEBOUNCE_S = 2.0


class SignalHandlers:
    """Installs `self._handle` for `self.signals` (main thread only, as Python requires) and puts the
    previous handlers back on `uninstall`; a context manager. Subclasses set `signals` and `_handle`."""

    signals = HANDLED_SIGNALS

    def install(self):
        """Install the handlers; returns self."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(f"{type(self).__name__}.install() must be called from the main thread")
        self._previous = getattr(self, "_previous", {})
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self):
        """Restore the handlers that were installed before."""
        for sig, previous in getattr(self, "_previous", {}).items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}

    def __enter__(self):
        return self.install()

    def __exit__(self, *exc):
        self.uninstall()
        return False
