"""The manager's state machine drives the reference and the CUDA executor in lockstep; their pools stay equal.

The stand-in classes run everywhere (the CUDA executor's host-side logic on NumPy);
the gpu classes run the same machine on CuPy and skip without a GPU.  The last tests
show the comparison can fail: a CUDA executor with a broken op is caught.
"""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import pytest
from backends import gpu_backend
from hypothesis import Phase, settings
from hypothesis.stateful import run_state_machine_as_test
from lockstep import LockstepMachine, make_lockstep_machine

from hkv_core.plan import CopyPages, FillPages, LoadRecord, StoreRecord
from hkv_exec_cuda import executor as executor_module
from hkv_exec_cuda import numpy_backend
from hkv_exec_cuda.executor import CudaExecutor

STEPS = 25
EXAMPLES = max(1, settings().max_examples // 2)  # ci: 100 per class


def bind(machine: type[LockstepMachine], gpu: bool = False) -> type:
    case = machine.TestCase
    case.settings = settings(max_examples=EXAMPLES, stateful_step_count=STEPS)
    return pytest.mark.gpu(case) if gpu else case


StandInEvery1 = make_lockstep_machine(numpy_backend, "tiny_v4", default_pool_pages=48, retain_every_blocks=1)
StandInEvery2 = make_lockstep_machine(numpy_backend, "tiny_v4", default_pool_pages=24, retain_every_blocks=2,
                                      max_requests=4)
StandInCsa = make_lockstep_machine(numpy_backend, "tiny_csa", default_pool_pages=32, retain_every_blocks=1)
GpuEvery1 = make_lockstep_machine(gpu_backend, "tiny_v4", default_pool_pages=48, retain_every_blocks=1)

TestStandInEvery1 = bind(StandInEvery1)
TestStandInEvery2 = bind(StandInEvery2)
TestStandInCsa = bind(StandInCsa)
TestGpuEvery1 = bind(GpuEvery1, gpu=True)


# ----------------------------------------------------------- the comparison can fail


def copy_one_entry_short(self: CudaExecutor, op: Any, keep: list[Any]) -> None:
    pool = self.pools[op.pool]
    n = max(0, op.entries - 1)
    pool[op.dst, :, :n] = pool[op.src, :, :n]


def fill_the_wrong_byte(self: CudaExecutor, op: Any, keep: list[Any]) -> None:
    self.pools[op.pool].view(np.uint8)[self._index(op.pages)] = (op.value + 1) % 256


RECORD_OP = CudaExecutor._record


def load_runs_reversed(self: CudaExecutor, op: Any, records: Any) -> None:
    """Loads write their runs in reverse order (stores are right)."""
    if isinstance(op, LoadRecord) and len(op.runs) > 1:
        op = attrs.evolve(op, runs=op.runs[::-1])
    RECORD_OP(self, op, records)


def store_one_row_short(self: CudaExecutor, op: Any, records: Any) -> None:
    """Stores leave the last row of the record unwritten (loads are right)."""
    if isinstance(op, StoreRecord):
        page, first, stop = op.runs[-1]
        runs = (*op.runs[:-1], (page, first, stop - 1)) if stop - first > 1 else op.runs[:-1]
        if not runs:
            return
        op = attrs.evolve(op, runs=runs, versions=op.versions[:len(runs)])
    RECORD_OP(self, op, records)


@pytest.mark.parametrize("op, wrong, symptom", [
    (CopyPages, copy_one_entry_short, "pools differ"),
    (FillPages, fill_the_wrong_byte, "pools differ|completions differ"),
    (LoadRecord, load_runs_reversed, "pools differ"),
    (StoreRecord, store_one_row_short, "tier bytes differ|completions differ"),
], ids=["copy", "fill", "load", "store"])
def test_lockstep_catches_a_broken_cuda_op(op: type, wrong: Any, symptom: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if op in (LoadRecord, StoreRecord):
        monkeypatch.setattr(CudaExecutor, "_record", wrong)
    else:
        monkeypatch.setitem(executor_module._RUNNERS, op, wrong)
    with pytest.raises(AssertionError, match=symptom):
        run_state_machine_as_test(StandInEvery1, settings=settings(max_examples=600, stateful_step_count=STEPS,
                                                                   database=None, phases=[Phase.generate]))
