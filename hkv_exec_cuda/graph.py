"""CUDA Graph safety: static block-table buffers and captured steps that refuse moved addresses (F9).

A captured graph replays the kernels it recorded with the addresses it recorded.
The pools never move (CudaExecutor allocates them once), and the block tables a
step reads are `StaticTable`s: device buffers allocated once and rewritten in
place when pages move (an eviction to host and a reload into other pages).  A
`CapturedStep` remembers every address it was captured over and checks them at
each replay; a table that would need more pages than it was captured with, or a
pool or buffer that moved, is a `GraphAddressChanged` error - never a silent
re-capture (docs/cuda_executor.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from hkv_core.errors import GraphAddressChanged
from hkv_exec_cuda.executor import CudaExecutor

__all__ = ["CapturedStep", "StaticTable"]


class StaticTable:
    """One block table as a device int64 buffer of `capacity_pages` entries, allocated once (unused: page 0)."""

    def __init__(self, executor: CudaExecutor, name: str, capacity_pages: int, pages: Sequence[int] = ()) -> None:
        assert capacity_pages >= 1, capacity_pages
        self.executor, self.name, self.capacity_pages = executor, name, capacity_pages
        with executor.stream:
            self.array = executor.xp.zeros(capacity_pages, np.int64)
        self.address = executor.backend.address(self.array)
        self.pages = 0
        if len(pages):
            self.update(pages)

    def update(self, pages: Sequence[int]) -> None:
        """Rewrite the table in place (same buffer, same address); GraphAddressChanged beyond its capacity."""
        if len(pages) > self.capacity_pages:
            raise GraphAddressChanged(graph=self.name, what="block table length (pages)",
                                      captured=self.capacity_pages, found=len(pages))
        host = np.zeros(self.capacity_pages, np.int64)
        host[:len(pages)] = np.asarray(pages, np.int64)
        with self.executor.lock, self.executor.stream:
            self.array[...] = self.executor.xp.asarray(host)
            self.executor.stream.synchronize()
        self.pages = len(pages)
        assert self.executor.backend.address(self.array) == self.address


class CapturedStep:
    """`step` captured once over the executor's pools and `buffers`; `replay()` checks every address first."""

    def __init__(self, executor: CudaExecutor, name: str, step: Callable[[], None],
                 buffers: dict[str, Callable[[], Any]]) -> None:
        """`buffers`: name -> a function returning the array the step reads or writes now (where its owner
        keeps it), so that `check` sees an owner that swapped its array for another."""
        self.executor, self.name, self.buffers = executor, name, buffers
        with executor.lock:  # nothing else is queued on the stream while it is being captured
            self.pool_addresses = executor.addresses()
            self.buffer_addresses = {key: executor.backend.address(get()) for key, get in buffers.items()}
            self.graph = executor.backend.capture(executor.stream, step)
        self.replays = 0

    def check(self) -> None:
        """GraphAddressChanged for the first pool or buffer whose address is not the captured one."""
        now = self.executor.addresses()
        for pool, address in self.pool_addresses.items():
            if now.get(pool) != address:
                raise GraphAddressChanged(graph=self.name, what=f"pool {pool} base address", captured=address,
                                          found=now.get(pool))
        for key, address in self.buffer_addresses.items():
            found = self.executor.backend.address(self.buffers[key]())
            if found != address:
                raise GraphAddressChanged(graph=self.name, what=f"buffer {key} address", captured=address,
                                          found=found)

    def replay(self) -> None:
        """Check the addresses, launch the graph on the executor's stream and wait for it."""
        with self.executor.lock:
            self.check()
            self.graph.launch(self.executor.stream)
            self.executor.stream.synchronize()
            self.replays += 1
