"""Small array helpers for hot paths: one C call each, where NumPy's wrappers cost three or four.

`any_true(mask)` / `all_true(mask)` are the ufunc reductions behind
`mask.any()` / `mask.all()` without the Python-level method wrappers (empty
masks: False / True).
"""

from __future__ import annotations

import numpy as np

any_true = np.logical_or.reduce
all_true = np.logical_and.reduce
