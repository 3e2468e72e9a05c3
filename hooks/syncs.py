"""Counting the places a capture reads a tensor's value on the host.

On a GPU every such read (``.item()``, ``.cpu()``, ``.tolist()``, ``.numpy()``, ``.to("cpu")``,
``bool(t)``, ``int(t)``, ``float(t)``, a tensor used as a Python index, ``.nonzero()``) makes the host wait for
the stream; on a CPU they cost nothing, so a CPU test cannot see the stall but can count the reads. The
counter patches those methods on ``torch.Tensor`` for the duration of a ``with`` block (one thread at a
time; a diagnostic for tests and benchmarks, never on in a capture).
"""

from __future__ import annotations

import contextlib
import functools
import threading
import traceback
from collections import Counter
from collections.abc import Iterator

import torch

READS = ("item", "cpu", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__", "__index__")
_LOCK = threading.Lock()


def _to_cpu(args: tuple, kwargs: dict) -> bool:
    target = kwargs.get("device", args[0] if args else None)
    if isinstance(target, torch.Tensor):
        target = target.device
    return target is not None and not isinstance(target, torch.dtype) and torch.device(target).type == "cpu"


class HostReads(Counter):
    """Host reads by kind (``item``, ``cpu``, ``to(cpu)``, ...); ``where`` counts those made by attnprobe's
    own code by line (file:line -> count), to find the one that grows."""

    def __init__(self) -> None:
        super().__init__()
        self.where: Counter = Counter()

    @property
    def total(self) -> int:
        return sum(self.values())


@contextlib.contextmanager
def count_host_reads(track: bool = True) -> Iterator[HostReads]:
    """Count host reads of tensors inside the block (see the module docstring)."""
    reads = HostReads()
    originals = {name: getattr(torch.Tensor, name) for name in (*READS, "to")}

    def ours() -> str | None:
        """file:line of the read when attnprobe's own code made it (the frame just above the patch)."""
        frame = traceback.extract_stack(limit=3)[0]
        path = frame.filename.replace("\\", "/")
        if "/attnprobe/" in path or "/hooks/" in path or "/attnprobe_hooks/" in path:
            return f"{path.rsplit('/', 2)[-1]}:{frame.lineno}"
        return None

    def wrap(name: str):
        fn = originals[name]

        @functools.wraps(fn)
        def counted(self, *args, **kwargs):
            if name != "to" or _to_cpu(args, kwargs):
                where = ours()
                # a move to the CPU of a tensor already there reads nothing: counted only in our own code (where
                # the same line on a GPU would copy), not in a library's ``.to(x.device)``
                if name != "to" or where is not None or self.device.type != "cpu":
                    reads["to(cpu)" if name == "to" else name.strip("_")] += 1
                    if where is not None and track:
                        reads.where[where] += 1
            return fn(self, *args, **kwargs)

        return counted

    with _LOCK:
        for name in originals:
            setattr(torch.Tensor, name, wrap(name))
        try:
            yield reads
        finally:
            for name, fn in originals.items():
                setattr(torch.Tensor, name, fn)
