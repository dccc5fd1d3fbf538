"""issue 27 (12): a bool is never a token id nor a request id.  A bool array was refused as tokens while a
Python list of bools was packed as 0 / 1 and served; `request_tokens(True)` answered for request 1.  Each
refusal is typed and changes nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from hkv_core.errors import InvalidArgument, InvalidTokens
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig, check_invariants


def tiny() -> CacheManager:
    return CacheManager(Layout.from_preset("tiny_v4"), ManagerConfig(default_pool_pages=16, key_seed=0))


@pytest.mark.parametrize("tokens", [[True, False, True], (True,), [5, 7, True, 9], [0, 1, False],
                                    [5, np.True_, 9], np.array([True, False])],
                         ids=["bools", "tuple", "an int list with a bool", "zeros and ones", "numpy bool", "array"])
def test_bools_are_refused_as_tokens_as_a_bool_array_is(tokens: Any) -> None:
    m = tiny()
    rid = m.add_request([3, 4, 5])
    before = m.snapshot()
    with pytest.raises(InvalidTokens) as err:
        m.add_request(tokens)
    assert "bool" in err.value.reason
    with pytest.raises(InvalidTokens):
        m.append_tokens(rid, tokens)
    assert m.snapshot() == before and check_invariants(m) == []
    assert m.request_tokens(m.add_request([0, 1, 0, 1]))[2] == 4  # zeros and ones as ints are token ids


def test_a_bool_is_not_a_request_id() -> None:
    m = tiny()
    m.add_request([9, 9, 9])  # request 0
    m.add_request([1, 2])  # request 1: True used to answer for it
    before = m.snapshot()
    for call in (lambda: m.request_tokens(True), lambda: m.match(False), lambda: m.release(True)):
        with pytest.raises(InvalidArgument) as err:
            call()
        assert err.value.argument == "rid" and "bool" in err.value.reason
    assert m.snapshot() == before and m.request_tokens(1) == (0, 0, 2)
