"""What both executors share beside the checks: the pools' NumPy dtypes and the copy tallies.

bf16 and fp8 have no NumPy dtype: their bytes are kept as uint16 and uint8 (an executor only moves bytes).
"""

from __future__ import annotations

import attrs
import numpy as np

from hkv_core.plan import Checksum, CopyPages, Op

__all__ = ["NUMPY_DTYPES", "Tally", "pages_moved"]

NUMPY_DTYPES: dict[str, type[np.generic]] = {"fp32": np.float32, "fp16": np.float16, "bf16": np.uint16,  # bf16,
                                              "fp8": np.uint8}  # fp8: their bits


@attrs.define
class Tally:
    """Running totals over every plan and every read / write."""

    plans: int = 0
    ops: int = 0
    pages_moved: int = 0
    entries_copied: int = 0
    entries_read: int = 0
    entries_written: int = 0


def pages_moved(op: Op) -> int:
    """Pages whose bytes an op moves (a copy of 0 entries moves none; a checksum only reads)."""
    return 0 if isinstance(op, Checksum) else (int(op.entries > 0) if isinstance(op, CopyPages) else len(op.pages))
