"""Count kernel launches and device->host reads of any torch code, on the CPU as on a GPU.

    from spectr_repro.bench.counters import count_ops
    with count_ops() as counts:
        verifier(draft_tokens, draft_probs, target_probs, generator=g)
    counts.ops, counts.host_reads, counts.by_op.most_common(5)

What makes a decoding loop slow on a GPU is countable anywhere: every aten operator that computes
something is one kernel launch (~5-10 us of launch overhead on a GPU, whatever the tensor size), and
every read of a device value by the host (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``,
``nonzero``, boolean-mask indexing, ``torch.equal``, ``.cpu()``) waits for every queued kernel: a full
synchronisation. Both are counted by operator dispatch (``TorchDispatchMode``) and, for the reads
that never reach the dispatcher (``tolist``, ``numpy``; ``item``, ``int``, ``float``, ``bool`` and
``__index__`` of a tensor made under ``torch.inference_mode``, whose scalar read skips the Python
dispatcher), by ``TorchFunctionMode``. A scalar read is counted once either way.

Counting rules (deterministic, so budgets can be tests):
- ``ops``: aten operators that are not views (``select``, ``slice``, ``view``, ``expand``, ...
  launch nothing) and not pure metadata (``detach``, ``alias``, ``lift_fresh``).
- ``host_reads``: ``_local_scalar_dense`` (item, float, int, bool of a tensor), ``nonzero``,
  ``equal``, ``masked_select``, ``unique``-like ops and ``repeat_interleave`` by a tensor of repeats
  without ``output_size`` (their output size is data-dependent; an integer repeat count is not),
  indexing with a boolean mask, and the function-level
  ``tolist``, ``numpy``, ``cpu`` and ``to("cpu")``: on the CPU these are free, on a GPU each one
  is a synchronisation, which is the point of counting them here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Operators whose result the host must read (or whose output size depends on data).
_SYNC_OPS = frozenset({
    "aten::_local_scalar_dense", "aten::nonzero", "aten::nonzero_static", "aten::equal", "aten::masked_select",
    "aten::unique_consecutive", "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::is_nonzero",
})
_DATA_DEPENDENT_SIZE = frozenset({"aten::repeat_interleave"})  # unless output_size is given
# Operators that launch nothing besides views.
_METADATA_OPS = frozenset({"aten::detach", "aten::alias", "aten::lift_fresh", "aten::_to_copy_meta"})
_HOST_READ_METHODS = frozenset({"tolist", "numpy"})
# Scalar reads: counted at the function level (seen in inference mode too), once, not again by dispatch.
_SCALAR_READ_METHODS = frozenset({"item", "__int__", "__float__", "__bool__", "__index__", "__complex__"})
_SCALAR_DISPATCH_OPS = frozenset({"aten::_local_scalar_dense", "aten::is_nonzero"})


@dataclass
class OpCounts:
    ops: int = 0  # kernel launches: non-view aten operators
    host_reads: int = 0  # device -> host synchronisations
    by_op: Counter = field(default_factory=Counter)  # op name -> count (ops only)
    reads_by_kind: Counter = field(default_factory=Counter)  # what caused each host read

    def __add__(self, other: OpCounts) -> OpCounts:
        return OpCounts(self.ops + other.ops, self.host_reads + other.host_reads,
                        self.by_op + other.by_op, self.reads_by_kind + other.reads_by_kind)

    def as_dict(self) -> dict[str, int]:
        return {"ops": self.ops, "host_reads": self.host_reads}


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, counts: OpCounts, scalar_reads: list[int]) -> None:
        super().__init__()
        self.counts = counts
        self.scalar_reads = scalar_reads  # [depth]: > 0 inside a scalar read already counted

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func._schema.name
        if name in _SCALAR_DISPATCH_OPS and self.scalar_reads[0]:
            pass  # counted by _FunctionCounter
        elif name in _SYNC_OPS:
            self._read(name)
        elif (name in _DATA_DEPENDENT_SIZE and func._overloadname != "self_int"  # int repeats: size known
              and kwargs.get("output_size") is None):
            self._read(name)
        elif name == "aten::index" and _has_boolean_index(args):
            self._read("boolean mask index")
        if not func.is_view and name not in _METADATA_OPS and name != "aten::_local_scalar_dense":
            self.counts.ops += 1
            self.counts.by_op[name] += 1
        return func(*args, **kwargs)

    def _read(self, kind: str) -> None:
        self.counts.host_reads += 1
        self.counts.reads_by_kind[kind] += 1


class _FunctionCounter(TorchFunctionMode):
    def __init__(self, counts: OpCounts, scalar_reads: list[int]) -> None:
        super().__init__()
        self.counts = counts
        self.scalar_reads = scalar_reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _SCALAR_READ_METHODS and args and isinstance(args[0], torch.Tensor):
            if not self.scalar_reads[0]:
                self.counts.host_reads += 1
                self.counts.reads_by_kind[name] += 1
            self.scalar_reads[0] += 1
            try:
                return func(*args, **kwargs)
            finally:
                self.scalar_reads[0] -= 1
        if name in _HOST_READ_METHODS or name == "cpu" or (name == "to" and _to_cpu(args, kwargs)):
            self.counts.host_reads += 1
            self.counts.reads_by_kind[name] += 1
        return func(*args, **kwargs)


def _has_boolean_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices or ())


def _to_cpu(args, kwargs) -> bool:
    """``t.to("cpu")`` with the host named explicitly. ``t.to(some_device)`` is not counted: on a CPU run
    every device is the host, so a move to the tensor's own device would be miscounted as a read."""
    target = kwargs.get("device", args[1] if len(args) > 1 else None)
    return isinstance(target, str) and target.startswith("cpu")


@contextmanager
def count_ops() -> Iterator[OpCounts]:
    """Count ops and host reads of everything run inside the block (the counts fill in live)."""
    counts = OpCounts()
    scalar_reads = [0]
    with _FunctionCounter(counts, scalar_reads), _DispatchCounter(counts, scalar_reads):
        yield counts


__all__ = ["OpCounts", "count_ops"]
