"""Small array helpers for hot paths: one C call each, where NumPy's wrappers cost three or four.

`any_true(mask)` / `all_true(mask)` are the ufunc reductions behind
`mask.any()` / `mask.all()` without the Python-level method wrappers (empty
masks: False / True).
"""

from __future__ import annotations

import numpy as np

any_true = np.logical_or.reduce
all_true = np.logical_and.reduce


def distinct(values: np.ndarray) -> np.ndarray:
    """The sorted distinct values of a 1-D array (np.unique without its wrappers)."""
    if values.size <= 1:
        return values.copy()
    ordered = np.sort(values)
    keep = np.empty(ordered.size, np.bool_)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]
