"""Property tests of hkv_core.block_keys: seeded, prefix-chained block keys (docs/failures.md F10)."""

from __future__ import annotations

import random
from unittest import mock

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from hkv_core import CacheManager, Layout, ManagerConfig, block_keys
from hkv_core.block_keys import ALGORITHMS, BlockHasher, ExtraKeys, key_bytes, keys_as_void
from hkv_core.errors import ConfigError, HkvError, InvalidTokens, UnitError

TOKEN_LIMIT = 2**31
algorithms = st.sampled_from(ALGORITHMS)
block_sizes = st.sampled_from([1, 2, 3, 4, 16])
seeds = st.integers(min_value=0, max_value=2**64 - 1)
token_lists = st.lists(st.integers(min_value=0, max_value=TOKEN_LIMIT - 1), max_size=80)
salts = st.none() | st.text(max_size=6)
lora_ids = st.none() | st.text(max_size=4) | st.integers(min_value=0, max_value=2**64 - 1)  # add_request's range
mm_items = st.lists(st.tuples(st.integers(min_value=0, max_value=90), st.binary(min_size=1, max_size=8)),
                    max_size=4)
extras = st.builds(ExtraKeys, cache_salt=salts, lora_id=lora_ids, mm_keys=mm_items)
chunk_bytes = st.sampled_from([4, 8, 12, 64, 1 << 16])


def toks(values: list[int], dtype: str = "int64") -> np.ndarray:
    return np.array(values, dtype=dtype)


def void_set(keys: np.ndarray) -> set[bytes]:
    return {k.tobytes() for k in keys_as_void(keys)}


def disjoint(a: np.ndarray, b: np.ndarray) -> bool:
    return not np.isin(keys_as_void(a), keys_as_void(b)).any()


# ------------------------------------------------------------------ shape and determinism


@given(token_lists, block_sizes, seeds, algorithms, extras)
def test_same_inputs_same_keys_and_equal_to_the_reference_loop(
        values: list[int], bt: int, seed: int, algorithm: str, extra: ExtraKeys) -> None:
    a = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    b = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    keys = a.hash_blocks(toks(values), extra)
    assert keys.shape == (len(values) // bt, 2) and keys.dtype == np.uint64
    assert np.array_equal(keys, b.hash_blocks(toks(values), extra))
    assert np.array_equal(keys, a.hash_blocks(toks(values), extra))
    assert np.array_equal(keys, a.reference_hash_blocks(toks(values), extra))
    assert len(void_set(keys)) == keys.shape[0]  # a chain never repeats a key


@given(token_lists, block_sizes, seeds, algorithms, extras, chunk_bytes)
def test_chunking_never_changes_the_keys(values: list[int], bt: int, seed: int, algorithm: str,
                                         extra: ExtraKeys, chunk: int) -> None:
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    expected = hasher.reference_hash_blocks(toks(values), extra)
    with mock.patch.object(block_keys, "_CHUNK_BYTES", chunk):
        assert np.array_equal(hasher.hash_blocks(toks(values), extra), expected)


@given(st.lists(st.integers(min_value=0, max_value=2**15 - 1), max_size=40), block_sizes, seeds, algorithms)
def test_keys_depend_on_token_ids_not_on_the_array_dtype_or_layout(
        values: list[int], bt: int, seed: int, algorithm: str) -> None:
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    expected = hasher.hash_blocks(toks(values))
    for dtype in ("int16", "uint16", "int32", "uint32", "uint64", ">i4", ">i8", "<u8"):
        assert np.array_equal(hasher.hash_blocks(toks(values, dtype)), expected), dtype
    strided = np.repeat(toks(values), 2)[::2]
    assert not strided.flags.c_contiguous or len(values) <= 1
    assert np.array_equal(hasher.hash_blocks(strided), expected)


@given(token_lists, token_lists, block_sizes, seeds, algorithms, extras)
def test_partial_trailing_block_is_ignored_and_keys_are_prefix_stable(
        values: list[int], more: list[int], bt: int, seed: int, algorithm: str, extra: ExtraKeys) -> None:
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    keys = hasher.hash_blocks(toks(values), extra)
    n = len(values) // bt
    assert np.array_equal(hasher.hash_blocks(toks(values[:n * bt]), extra), keys)
    longer = hasher.hash_blocks(toks(values + more), extra)
    assert np.array_equal(longer[:n], keys)


def test_empty_and_short_inputs_have_no_keys() -> None:
    hasher = BlockHasher(block_tokens=4, seed=1)
    for values in ([], [1], [1, 2, 3]):
        keys = hasher.hash_blocks(toks(values))
        assert keys.shape == (0, 2) and keys.dtype == np.uint64
        assert hasher.reference_hash_blocks(toks(values)).shape == (0, 2)


# ------------------------------------------------------------------ chaining


@given(st.data(), block_sizes, seeds, algorithms, extras)
def test_changing_one_token_changes_its_block_and_every_later_key_only(
        data: st.DataObject, bt: int, seed: int, algorithm: str, extra: ExtraKeys) -> None:
    values = data.draw(st.lists(st.integers(0, TOKEN_LIMIT - 1), min_size=bt, max_size=60))
    pos = data.draw(st.integers(0, len(values) - 1))
    new = data.draw(st.integers(0, TOKEN_LIMIT - 1).filter(lambda v: v != values[pos]))
    changed = list(values)
    changed[pos] = new
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    a, b = hasher.hash_blocks(toks(values), extra), hasher.hash_blocks(toks(changed), extra)
    i = pos // bt
    assert np.array_equal(a[:i], b[:i])
    assert (a[i:] != b[i:]).any(axis=1).all()
    assert disjoint(a[i:], b)


@given(st.data(), block_sizes, seeds, algorithms, extras)
def test_parent_continuation_equals_hashing_at_once(
        data: st.DataObject, bt: int, seed: int, algorithm: str, extra: ExtraKeys) -> None:
    values = data.draw(token_lists)
    n = len(values) // bt
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    whole = hasher.hash_blocks(toks(values), extra)
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=3)))
    pieces, parent, start = [], None, 0
    for cut in [*cuts, None]:
        stop = len(values) if cut is None else cut * bt
        if cut is not None and cut <= start:
            continue
        piece = hasher.hash_blocks(toks(values[start * bt:stop]), extra, parent=parent, start_block=start)
        assert np.array_equal(piece, hasher.reference_hash_blocks(
            toks(values[start * bt:stop]), extra, parent=parent, start_block=start))
        pieces.append(piece)
        if cut is not None:
            start = cut
            parent = key_bytes(whole, cut - 1) if cut > 0 else None
    assert np.array_equal(np.concatenate(pieces), whole)


@given(token_lists, block_sizes, seeds, algorithms)
def test_a_parent_from_another_chain_gives_other_keys(
        values: list[int], bt: int, seed: int, algorithm: str) -> None:
    assume(len(values) >= bt)
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    a = hasher.hash_blocks(toks(values), parent=bytes(16), start_block=1)
    b = hasher.hash_blocks(toks(values), parent=b"\x01" + bytes(15), start_block=1)
    assert disjoint(a, b) and disjoint(a, hasher.hash_blocks(toks(values)))


# ------------------------------------------------------------------ extras, seeds, algorithms (F10)


@given(token_lists, block_sizes, seeds, algorithms, extras, extras)
def test_different_salts_or_lora_ids_never_share_a_key(
        values: list[int], bt: int, seed: int, algorithm: str, x: ExtraKeys, y: ExtraKeys) -> None:
    assume((x.cache_salt, x.lora_id) != (y.cache_salt, y.lora_id))
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    assert disjoint(hasher.hash_blocks(toks(values), x), hasher.hash_blocks(toks(values), y))


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("x", "y"), [
    (ExtraKeys(), ExtraKeys(cache_salt="")),
    (ExtraKeys(cache_salt="a"), ExtraKeys(cache_salt="b")),
    (ExtraKeys(lora_id=1), ExtraKeys(lora_id="1")),
    (ExtraKeys(lora_id=None), ExtraKeys(lora_id=0)),
    (ExtraKeys(cache_salt="ab"), ExtraKeys(cache_salt="a", lora_id="b")),
    (ExtraKeys(mm_keys=[(0, b"x")]), ExtraKeys(mm_keys=[(0, b"y")])),
    (ExtraKeys(mm_keys=[(0, b"x")]), ExtraKeys(mm_keys=[(1, b"x")])),
    (ExtraKeys(mm_keys=[(0, b"xy")]), ExtraKeys(mm_keys=[(0, b"x"), (0, b"y")])),
])
def test_named_extra_pairs_never_share_a_key(algorithm: str, x: ExtraKeys, y: ExtraKeys) -> None:
    hasher = BlockHasher(block_tokens=4, seed=7, algorithm=algorithm)
    tokens = np.arange(40)
    assert x.digest() != y.digest()
    assert disjoint(hasher.hash_blocks(tokens, x), hasher.hash_blocks(tokens, y))


@given(st.data(), block_sizes, seeds, algorithms, extras)
def test_a_multimodal_item_changes_its_block_and_all_later_keys(
        data: st.DataObject, bt: int, seed: int, algorithm: str, extra: ExtraKeys) -> None:
    values = data.draw(token_lists)
    offset = data.draw(st.integers(0, 100))
    content = data.draw(st.binary(min_size=1, max_size=8))
    other = ExtraKeys(cache_salt=extra.cache_salt, lora_id=extra.lora_id,
                      mm_keys=[*extra.mm_keys, (offset, content)])
    hasher = BlockHasher(block_tokens=bt, seed=seed, algorithm=algorithm)
    a, b = hasher.hash_blocks(toks(values), extra), hasher.hash_blocks(toks(values), other)
    i = min(offset // bt, a.shape[0])
    assert np.array_equal(a[:i], b[:i])  # blocks before the item stay shareable
    assert disjoint(a[i:], b) and disjoint(b[i:], a)


@given(token_lists, block_sizes, seeds, seeds, algorithms, extras)
def test_different_seeds_never_share_a_key(
        values: list[int], bt: int, s1: int, s2: int, algorithm: str, extra: ExtraKeys) -> None:
    assume(s1 != s2)
    a = BlockHasher(block_tokens=bt, seed=s1, algorithm=algorithm).hash_blocks(toks(values), extra)
    b = BlockHasher(block_tokens=bt, seed=s2, algorithm=algorithm).hash_blocks(toks(values), extra)
    assert disjoint(a, b)


@given(token_lists, block_sizes, seeds, extras)
def test_algorithms_never_share_a_key(values: list[int], bt: int, seed: int, extra: ExtraKeys) -> None:
    a, b = (BlockHasher(block_tokens=bt, seed=seed, algorithm=alg).hash_blocks(toks(values), extra)
            for alg in ALGORITHMS)
    assert disjoint(a, b)


def test_default_seeds_are_drawn_per_hasher() -> None:
    tokens = np.arange(64)
    hashers = [BlockHasher(block_tokens=16) for _ in range(4)]
    assert len({h.seed for h in hashers}) == 4
    assert all(0 <= h.seed < 2**64 for h in hashers)
    keys = [h.hash_blocks(tokens) for h in hashers]
    assert all(disjoint(keys[0], k) for k in keys[1:])
    assert str(hashers[0].seed) not in repr(hashers[0])


# ------------------------------------------------------------------ extra keys


@given(extras, extras)
def test_extra_digest_is_canonical_and_unambiguous(x: ExtraKeys, y: ExtraKeys) -> None:
    assert (x.digest() == y.digest()) == (x == y)


@given(extras, st.randoms())
def test_multimodal_item_order_does_not_matter(extra: ExtraKeys, rnd: random.Random) -> None:
    shuffled = list(extra.mm_keys)
    rnd.shuffle(shuffled)
    other = ExtraKeys(cache_salt=extra.cache_salt, lora_id=extra.lora_id, mm_keys=shuffled)
    assert other == extra and other.digest() == extra.digest()
    hasher = BlockHasher(block_tokens=2, seed=3)
    assert np.array_equal(hasher.hash_blocks(np.arange(50), extra), hasher.hash_blocks(np.arange(50), other))


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"cache_salt": b"salt"}, "cache_salt"),
    ({"cache_salt": 3}, "cache_salt"),
    ({"lora_id": True}, "lora_id"),
    ({"lora_id": 1.5}, "lora_id"),
    ({"mm_keys": [(-1, b"x")]}, "mm_keys"),
    ({"mm_keys": [(0, b"")]}, "mm_keys"),
    ({"mm_keys": [(0, "x")]}, "mm_keys"),
    ({"mm_keys": [(True, b"x")]}, "mm_keys"),
    ({"mm_keys": [(0, b"x", 1)]}, "mm_keys"),
    ({"mm_keys": b"xx"}, "mm_keys"),
])
def test_bad_extra_keys_raise_config_error(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        ExtraKeys(**kwargs)  # type: ignore[arg-type]
    assert info.value.source == "ExtraKeys" and info.value.key == key


# ------------------------------------------------------------------ key helpers


@given(token_lists, block_sizes, seeds)
def test_key_bytes_and_void_view_agree(values: list[int], bt: int, seed: int) -> None:
    keys = BlockHasher(block_tokens=bt, seed=seed).hash_blocks(toks(values))
    void = keys_as_void(keys)
    assert void.shape == (keys.shape[0],) and void.dtype == np.dtype("V16")
    for i in range(keys.shape[0]):
        kb = key_bytes(keys, i)
        assert len(kb) == 16 and kb == void[i].tobytes() == keys[i].astype("<u8").tobytes()
        assert (void == void[i]).sum() == 1
    if keys.shape[0]:
        assert key_bytes(keys, -1) == void[-1].tobytes()


# ------------------------------------------------------------------ errors


BAD_TOKENS = [
    (np.array([1.0, 2.0]), "integer"),
    (np.array([1, 2], dtype=np.float32), "integer"),
    (np.zeros((2, 4), dtype=np.int64), "1-D"),
    (np.array(5), "1-D"),
    (np.array([3, -1, 4]), "[0, 2**31)"),
    (np.array([3, 2**31]), "[0, 2**31)"),
    (np.array([2**31], dtype=np.uint32), "[0, 2**31)"),
    (np.array([2**63], dtype=np.uint64), "[0, 2**31)"),
    (np.array([-1], dtype=np.int8), "[0, 2**31)"),
    (np.array([True, False]), "integer"),
    (np.array([1, 2], dtype=object), "integer"),
    (np.array(["1"]), "integer"),
    (np.array([1, 2], dtype="m8[s]"), "integer"),
]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
@pytest.mark.parametrize(("tokens", "why"), BAD_TOKENS)
def test_bad_token_arrays_raise_invalid_tokens_with_fields(tokens: np.ndarray, why: str, algorithm: str) -> None:
    hasher = BlockHasher(block_tokens=1, seed=1, algorithm=algorithm)
    for method in (hasher.hash_blocks, hasher.reference_hash_blocks):
        with pytest.raises(InvalidTokens) as info:
            method(tokens)
        err = info.value
        assert isinstance(err, HkvError) and why in err.reason
        assert err.fields == {"reason": err.reason, "dtype": str(tokens.dtype), "shape": tokens.shape}
        assert err.dtype == str(tokens.dtype) and err.shape == tokens.shape


@pytest.mark.parametrize("tokens", [[1, 2, 3], (1, 2), "abc", None, 7])
def test_non_arrays_raise_invalid_tokens(tokens: object) -> None:
    with pytest.raises(InvalidTokens) as info:
        BlockHasher(block_tokens=1, seed=1).hash_blocks(tokens)  # type: ignore[arg-type]
    assert info.value.dtype is None and info.value.shape is None


@given(st.data(), block_sizes, algorithms)
def test_one_bad_id_anywhere_fails_the_whole_call(data: st.DataObject, bt: int, algorithm: str) -> None:
    values = data.draw(st.lists(st.integers(0, TOKEN_LIMIT - 1), min_size=1, max_size=60))
    pos = data.draw(st.integers(0, len(values) - 1))  # may sit in the trailing partial block
    bad = data.draw(st.integers(-(2**62), -1) | st.integers(TOKEN_LIMIT, 2**62))
    values[pos] = bad
    with pytest.raises(InvalidTokens) as info:
        BlockHasher(block_tokens=bt, seed=1, algorithm=algorithm).hash_blocks(toks(values))
    assert str(pos) in info.value.reason and str(bad) in info.value.reason


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"block_tokens": 0}, "block_tokens"),
    ({"block_tokens": -16}, "block_tokens"),
    ({"block_tokens": True}, "block_tokens"),
    ({"block_tokens": 16.0}, "block_tokens"),
    ({"block_tokens": 16, "algorithm": "md5"}, "algorithm"),
    ({"block_tokens": 16, "algorithm": "XXH3_128"}, "algorithm"),
    ({"block_tokens": 16, "seed": -1}, "seed"),
    ({"block_tokens": 16, "seed": 2**64}, "seed"),
    ({"block_tokens": 16, "seed": "1"}, "seed"),
    ({"block_tokens": 16, "seed": True}, "seed"),
])
def test_bad_hasher_arguments_raise_config_error(kwargs: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError) as info:
        BlockHasher(**kwargs)  # type: ignore[arg-type]
    assert info.value.source == "BlockHasher" and info.value.key == key


@pytest.mark.parametrize(("kwargs", "name"), [
    ({"start_block": 1}, "start_block"),
    ({"parent": bytes(16)}, "start_block"),
    ({"parent": bytes(16), "start_block": -1}, "start_block"),
    ({"parent": bytes(15), "start_block": 1}, "parent_bytes"),
    ({"parent": "x" * 16, "start_block": 1}, "parent_bytes"),
])
def test_inconsistent_parent_or_start_block_raise_unit_error(kwargs: dict[str, object], name: str) -> None:
    hasher = BlockHasher(block_tokens=2, seed=1)
    with pytest.raises(UnitError) as info:
        hasher.hash_blocks(np.arange(8), **kwargs)  # type: ignore[arg-type]
    assert info.value.name == name


def test_a_large_prompt_matches_the_reference_loop() -> None:
    tokens = np.random.default_rng(5).integers(0, TOKEN_LIMIT, size=100_003, dtype=np.int64)
    extra = ExtraKeys(cache_salt="t", mm_keys=[(17, b"img"), (50_000, b"a"), (50_001, b"b"), (99_999, b"z")])
    for algorithm in ALGORITHMS:
        hasher = BlockHasher(block_tokens=16, seed=11, algorithm=algorithm)
        keys = hasher.hash_blocks(tokens, extra)
        assert keys.shape == (6250, 2)
        assert np.array_equal(keys, hasher.reference_hash_blocks(tokens, extra))
        assert np.array_equal(keys, hasher.hash_blocks(tokens.astype(np.int32), extra))


# ------------------------------------------------------------ keys bind the layout they describe

def test_keys_bind_the_layout_fingerprint() -> None:
    """With one seed, two layouts (even of equal block size) never share a key; one layout always does."""
    tokens = np.arange(64) % 50
    config = ManagerConfig(key_seed=5, default_pool_pages=16)

    def keys(name: str) -> bytes:
        m = CacheManager(Layout.from_preset(name), config)
        return bytes(m.core.requests.by_rid[m.add_request(tokens)].keys.tobytes())

    assert Layout.from_preset("tiny_v4").block_tokens == Layout.from_preset("tiny_csa").block_tokens
    assert keys("tiny_v4") == keys("tiny_v4")
    assert len({keys("tiny_v4"), keys("tiny_csa"), keys("llama_full"), keys("swa_full")}) == 4
    assert Layout.from_preset("tiny_v4").fingerprint() != Layout.from_preset("tiny_v4", block_tokens=16).fingerprint()
    plain = BlockHasher(block_tokens=8, seed=5)
    named = BlockHasher(block_tokens=8, seed=5, namespace=Layout.from_preset("tiny_v4").fingerprint())
    assert not np.array_equal(plain.hash_blocks(tokens), named.hash_blocks(tokens))
    assert np.array_equal(named.hash_blocks(tokens), named.reference_hash_blocks(tokens))


def test_the_seed_is_never_printed() -> None:
    hasher = BlockHasher(block_tokens=8, seed=123456789, namespace="layout")
    assert "123456789" not in repr(hasher) and "layout" in repr(hasher)
    with pytest.raises(ConfigError):
        BlockHasher(block_tokens=8, namespace=b"bytes")  # type: ignore[arg-type]
