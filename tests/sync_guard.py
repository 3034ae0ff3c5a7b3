"""A test-only guard that fails on every tensor operation that would make the host wait for a GPU.

On CUDA, reading a value of a device tensor on the host (`.item()`, `bool(t)`, a Python `if` on a
tensor, an output whose size depends on the data such as `nonzero`, `masked_select`, `unique`,
boolean-mask indexing) blocks the CPU until the GPU has finished all queued work: the launch queue
drains and the GPU idles while Python catches up. Such reads cannot be seen on a machine without a
GPU by timing, and FakeTensorMode with a fake CUDA device needs CUDA, so this guard is a
`TorchDispatchMode` over ordinary CPU tensors: every aten op passes through it, and the ops that
force a host read on CUDA raise `HostSyncError` at the line that issued them.

    with no_host_sync(allow=[(optimizer_step_counter, "torch keeps the step count on the host")]):
        loss = head.loss(logits, target)
        loss.backward()

Ops that are blocked (BLOCKED_OPS, plus the argument-dependent rules in `_blocked_reason`):
see the tables below. Besides aten ops, the Tensor methods that copy data to the host without any
aten op on a CPU tensor (`tolist`, `numpy`, `__array__`, `cpu`) are blocked while the guard is
active (not `.to(device)`: on CPU every device is the CPU, so it cannot be told from a real move).
With `block_host_data=True`, making a tensor from host data (`torch.tensor`, `new_tensor`,
indexing with a Python list: `aten.lift_fresh`) fails too: on CUDA that is a synchronous
host-to-device copy. It is off by default because `x[:, 0] = 0.0` lifts its Python number the
same way, and that one does not sync (the value stays a CPU scalar).

Exclusions are narrow and named: `allow` takes (tensor, reason) pairs, and a blocked op is let
through only when one of its tensor arguments *is* one of those tensors (object identity, not an
equal value, not a view). `guard.allowed` counts how often each reason was used, so a test can
assert that an exclusion is still needed. Violations are also recorded in `guard.violations` and
raised again at exit, so code that swallows exceptions cannot hide them.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Iterable, Optional, Sequence, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten


class HostSyncError(AssertionError):
    """An operation that would force a device-to-host sync on CUDA ran inside no_host_sync()."""


def _overloads(*packets):
    return [getattr(p, name) for p in packets for name in p.overloads()]


_READS_A_VALUE = ".item(), bool(), float(), int() or a Python `if`/`and`/`or` on a tensor reads its value on the host"
_DATA_SIZED = "the output's size depends on the values, so the host must read a count from the device"

# Ops that always force a host read on CUDA, with the reason shown in the error.
BLOCKED_OPS = {}
for _op, _why in [
    (aten._local_scalar_dense, _READS_A_VALUE),
    (aten.item, _READS_A_VALUE),
    (aten.is_nonzero, _READS_A_VALUE),
    (aten.equal, "torch.equal returns a Python bool computed on the device"),
    (aten.allclose, "torch.allclose returns a Python bool computed on the device"),
    (aten.nonzero, f"nonzero / argwhere / torch.where(cond) with one argument: {_DATA_SIZED}"),
    (aten.masked_select, f"masked_select: {_DATA_SIZED}"),
    (aten._unique, f"unique: {_DATA_SIZED}"),
    (aten._unique2, f"unique: {_DATA_SIZED}"),
    (aten.unique_dim, f"unique: {_DATA_SIZED}"),
    (aten.unique_consecutive, f"unique_consecutive: {_DATA_SIZED}"),
    (aten.unique_dim_consecutive, f"unique_consecutive: {_DATA_SIZED}"),
    (aten.bincount, f"bincount: {_DATA_SIZED} (its max)"),
    (aten._linalg_check_errors, "linalg error checking reads the LAPACK info on the host (use the *_ex variants)"),
]:
    for _overload in _overloads(_op):
        BLOCKED_OPS[_overload] = _why

_INDEX_OPS = set(_overloads(aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_))
_REPEAT_INTERLEAVE = set(_overloads(aten.repeat_interleave))
_MASKED_FILL_TENSOR = {aten.masked_fill.Tensor, aten.masked_fill_.Tensor}
_HISTC = set(_overloads(aten.histc))
_LIFT_FRESH = set(_overloads(aten.lift_fresh, aten.lift_fresh_copy))

# Ops blocked only for some arguments (see _blocked_reason), listed for reports.
CONDITIONALLY_BLOCKED = {
    "aten.index / index_put(_) / _index_put_impl_": "with a boolean (or uint8) index: mask indexing "
                                                     "runs nonzero inside",
    "aten.repeat_interleave": "without output_size: the output size is the sum of the repeats",
    "aten.masked_fill.Tensor": "with a tensor value: the kernel reads it with .item()",
    "aten.histc": "with min == max: the range is read from the data",
    "aten.lift_fresh": "with block_host_data=True: a tensor made from host data (torch.tensor, "
                       "new_tensor, list indices), a synchronous host-to-device copy on CUDA",
}
HOST_COPY_METHODS = ("tolist", "numpy", "__array__", "cpu")


def _blocked_reason(func, args, kwargs, block_host_data: bool) -> Optional[str]:
    why = BLOCKED_OPS.get(func)
    if why is not None:
        return why
    if func in _INDEX_OPS:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices):
            return f"boolean-mask indexing (x[mask], x[mask] = v): {_DATA_SIZED}; use torch.where or masked_fill"
        return None
    if func in _REPEAT_INTERLEAVE:
        if kwargs.get("output_size") is None:
            return f"repeat_interleave without output_size: {_DATA_SIZED}"
        return None
    if func in _MASKED_FILL_TENSOR:
        return "masked_fill with a tensor value reads it with .item(); pass a Python number or use torch.where"
    if func in _HISTC:
        lo = args[2] if len(args) > 2 else kwargs.get("min", 0)
        hi = args[3] if len(args) > 3 else kwargs.get("max", 0)
        return f"histc with min == max: {_DATA_SIZED} (its range)" if lo == hi else None
    if func in _LIFT_FRESH and block_host_data:
        return ("a tensor made from host data (torch.tensor, new_tensor, indexing with a Python list) is a "
                "synchronous host-to-device copy on CUDA; keep Python numbers as numbers or build it once")
    return None


class _HostSyncGuard(TorchDispatchMode):
    def __init__(self, allow: Sequence[Tuple[torch.Tensor, str]], block_host_data: bool):
        super().__init__()
        self.allow = list(allow)
        self.block_host_data = block_host_data
        self.allowed = Counter()
        self.violations = []

    def excuse(self, tensors: Iterable) -> Optional[str]:
        """The reason of the first allowed tensor among `tensors` (identity), or None."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                for allowed, reason in self.allow:
                    if t is allowed:
                        return reason
        return None

    def fail(self, what: str, why: str, tensors: Iterable):
        reason = self.excuse(tensors)
        if reason is not None:
            self.allowed[reason] += 1
            return
        message = f"{what} would sync with the GPU: {why}"
        self.violations.append(message)
        raise HostSyncError(message)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        why = _blocked_reason(func, args, kwargs, self.block_host_data)
        if why is not None:
            self.fail(str(func), why, tree_leaves((args, kwargs)))
        return func(*args, **kwargs)


@contextlib.contextmanager
def _host_copy_methods_blocked(guard: _HostSyncGuard):
    """Tensor methods that copy to the host without an aten op on CPU tensors, blocked."""
    originals = {name: getattr(torch.Tensor, name) for name in HOST_COPY_METHODS}

    def blocked(name):
        original = originals[name]

        def method(self, *args, **kwargs):
            guard.fail(f"Tensor.{name}", "it copies device data to the host", [self])
            return original(self, *args, **kwargs)

        method.__name__ = name
        return method

    for name in HOST_COPY_METHODS:
        setattr(torch.Tensor, name, blocked(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


@contextlib.contextmanager
def no_host_sync(allow: Sequence[Tuple[torch.Tensor, str]] = (), block_host_data: bool = False):
    """Fail (HostSyncError) on every op in the block that would force a host read on CUDA.

    allow: (tensor, reason) pairs; ops on exactly these tensor objects are let through and
    counted in guard.allowed[reason]. block_host_data: also fail on tensors made from host data
    (torch.tensor and the like). Yields the guard (its .allowed and .violations).
    """
    for pair in allow:
        if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], torch.Tensor)
                and isinstance(pair[1], str) and pair[1].strip()):
            raise TypeError("allow takes (tensor, 'reason why this host read is not a GPU sync') pairs")
    guard = _HostSyncGuard(allow, block_host_data)
    with _host_copy_methods_blocked(guard), guard:
        yield guard
    if guard.violations:  # raised inside but swallowed by the code under test
        raise HostSyncError(f"{len(guard.violations)} host sync(s) were caught and swallowed; first: "
                            f"{guard.violations[0]}")
