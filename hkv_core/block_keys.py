"""Block keys: seeded, prefix-chained 128-bit keys for every complete block of a prompt.

A prompt is cut into blocks of ``block_tokens`` tokens; only complete blocks
get a key (a trailing partial block gets none until it completes).  Block
``i``'s key covers every token of blocks ``0..i`` and every extra input that
changes the KV (tenant cache salt, LoRA adapter, multimodal items), so two
requests share a key only if they would compute the same KV for that block
(``docs/failures.md`` F10: vLLM #36708, GHSA-rm76-4mrf-v9r8).

Definition (``H`` is the hasher's algorithm, keyed with its secret seed)::

    root    = H(DOMAIN || algorithm || block_tokens || namespace || extra_digest)
    key_-1  = root                        (or ``parent`` when continuing a chain)
    key_i   = H_block(key_{i-1} || le32(tokens of block i) || items_i)

- ``namespace``: what the keys describe, length-prefixed; a CacheManager
  passes its layout's fingerprint (``Layout.fingerprint``: model, block size,
  every pool's ABI id and geometry), so two layouts never share a key even
  with one seed (a persisted or shared cache cannot serve one layout's bytes
  to another).
- ``extra_digest`` = ``H("hkv.extra" || ExtraKeys.shared_encoding())``: the
  salt and LoRA id, length-prefixed and type-tagged.
- ``items_i`` is empty, or the count-prefixed encoding of the multimodal items
  whose token offset falls inside block ``i`` (``ExtraKeys.items_encoding``).
  An item changes the key of its block and, through the chain, of every later
  block; earlier blocks stay shareable.  Every block input is therefore
  ``16 + 4 * block_tokens`` bytes, or longer only when it carries items: the
  encoding is unambiguous.
- ``xxh3_128``: ``H(m) = XXH3_128(m, seed)`` with a secret 64-bit seed drawn
  per hasher (``secrets.randbits(64)``) unless given; ``H_block`` is XXH3_128
  seeded with a 64-bit seed derived from ``(seed, extra_digest)``, so the
  extras enter every block, not only the root.
- ``sha256``: ``H(m) = SHA-256(le64(seed) || m)[:16]``; ``H_block(m) =
  SHA-256(le64(seed) || extra_digest || m)[:16]``.

Keys are returned as an ``(n_blocks, 2)`` ``uint64`` array, one 16-byte key
per row (``key_bytes`` gives the bytes, ``keys_as_void`` a ``V16`` view for
vectorised equality, ``np.isin`` and dict keys).  ``parent`` (the 16-byte key
of block ``start_block - 1``) continues a chain: hashing a prompt in pieces
split at block boundaries gives exactly the keys of hashing it at once.

Speed: the chain is evaluated by C iterators (``map`` over a list iterator
that sees the keys as ``list.extend`` appends them), with no Python bytecode
per block, in chunks of about 64 KiB of tokens so that every temporary is
reused rather than freshly paged in; ``reference_hash_blocks`` is the obvious
per-block loop with the same results, used by the tests and as a fallback.
``benchmarks/bench_block_keys.py`` measures it against one plain XXH3 call
over the whole prompt.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import operator
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any, cast

import attrs
import numpy as np
import xxhash

from hkv_core.errors import ConfigError, InvalidTokens, UnitError

__all__ = ["ALGORITHMS", "CONTEXT_MEMO", "KEY_BYTES", "KEY_DTYPE", "NO_EXTRA", "SEED_LIMIT", "TOKEN_BYTES",
           "TOKEN_ID_LIMIT", "BlockHasher", "ExtraKeys", "checked_tokens", "key_bytes", "keys_as_void", "keys_bytes"]

KEY_BYTES = 16  # one block key: 128 bits
TOKEN_BYTES = 4  # tokens are hashed as little-endian 32-bit ids
TOKEN_ID_LIMIT = 2**31  # token ids lie in [0, TOKEN_ID_LIMIT)
SEED_LIMIT = 2**64  # seeds lie in [0, SEED_LIMIT)
ALGORITHMS = ("xxh3_128", "sha256")  # what a BlockHasher hashes with (xxh3_128 unless asked)
KEY_DTYPE = np.dtype("<u8")  # each key is two little-endian 64-bit words
CONTEXT_MEMO = 256  # salts and adapters whose key context a hasher remembers
_CHUNK_BYTES = 64 * 1024  # token bytes hashed per chunk (temporaries stay small and reused)

_DOMAIN = b"hkv.block-key.v1\x00"
_EXTRA_TAG = b"hkv.extra.v1\x00"
_BLOCK_SEED_TAG = b"hkv.block-seed.v1\x00"


def _le64(value: int) -> bytes:
    return struct.pack("<Q", value)


def _field(data: bytes) -> bytes:
    """Length-prefixed bytes: unambiguous when concatenated."""
    return _le64(len(data)) + data


def _text(value: str) -> bytes:
    return _field(value.encode("utf-8", "surrogatepass"))


# ------------------------------------------------------------------ extra keys


def _check_salt(_inst: object, _attr: object, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise ConfigError(f"must be a str or None, got {type(value).__name__}",
                          source="ExtraKeys", key="cache_salt")


def _check_lora(_inst: object, _attr: object, value: Any) -> None:
    if value is None or isinstance(value, str):
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"must be a str, an int or None, got {type(value).__name__}",
                          source="ExtraKeys", key="lora_id")
    if not 0 <= value < 1 << 64:  # a KV event carries it as an unsigned 64-bit integer (vLLM's wire format)
        raise ConfigError("an integer adapter id must lie in [0, 2**64) (a KV event carries it as 64 bits); "
                          "name a larger or negative one by a str", source="ExtraKeys", key="lora_id")


def _mm_item(item: object) -> tuple[int, bytes]:
    if not isinstance(item, tuple | list) or len(item) != 2:
        raise ConfigError(f"each item must be (token offset, content hash bytes), got {item!r}",
                          source="ExtraKeys", key="mm_keys")
    offset, content = item
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0:
        raise ConfigError(f"item offset must be an int >= 0, got {offset!r}",
                          source="ExtraKeys", key="mm_keys")
    if not isinstance(content, bytes | bytearray | memoryview) or len(content) == 0:
        raise ConfigError(f"item content hash must be non-empty bytes, got {type(content).__name__}",
                          source="ExtraKeys", key="mm_keys")
    return int(offset), bytes(content)


def _canonical_mm_keys(items: Iterable[tuple[int, bytes]] | None) -> tuple[tuple[int, bytes], ...]:
    """Validate the multimodal items and sort them: their order in the request does not matter."""
    if items is None:
        return ()
    if isinstance(items, str | bytes) or not isinstance(items, Iterable):
        raise ConfigError(f"must be a sequence of (offset, hash) pairs, got {type(items).__name__}",
                          source="ExtraKeys", key="mm_keys")
    return tuple(sorted(_mm_item(item) for item in items))


def _encode_items(items: Iterable[tuple[int, bytes]]) -> bytes:
    listed = list(items)
    return _le64(len(listed)) + b"".join(_le64(o) + _field(h) for o, h in listed)


@attrs.frozen(kw_only=True)
class ExtraKeys:
    """Every input besides the tokens that changes a block's KV.

    ``cache_salt``: tenant isolation; requests with different salts (``None``
    included) never share a key.  ``lora_id``: the adapter (``"1"`` and ``1``
    differ; an int lies in ``[0, 2**64)``).  ``mm_keys``: multimodal items as ``(token offset, content hash)``;
    an item is mixed into the key of the block containing its offset, hence
    into every later block; items are kept sorted.
    """

    cache_salt: str | None = attrs.field(default=None, validator=_check_salt)
    lora_id: str | int | None = attrs.field(default=None, validator=_check_lora)
    mm_keys: tuple[tuple[int, bytes], ...] = attrs.field(default=(), converter=_canonical_mm_keys)

    def shared_encoding(self) -> bytes:
        """Canonical encoding of the fields that apply to every block (salt, LoRA id)."""
        salt = b"\x00" if self.cache_salt is None else b"\x01" + _text(self.cache_salt)
        if self.lora_id is None:
            lora = b"\x00"
        elif isinstance(self.lora_id, str):
            lora = b"\x01" + _text(self.lora_id)
        else:
            lora = b"\x02" + _text(str(self.lora_id))
        return salt + lora

    def items_encoding(self, lo_tokens: int, hi_tokens: int) -> bytes:
        """Encoding of the items with ``lo_tokens <= offset < hi_tokens``; ``b""`` if there are none."""
        items = [(o, h) for o, h in self.mm_keys if lo_tokens <= o < hi_tokens]
        return _encode_items(items) if items else b""

    def digest(self) -> bytes:
        """Canonical, unambiguous encoding of every field (length-prefixed, type-tagged)."""
        return _EXTRA_TAG + self.shared_encoding() + _encode_items(self.mm_keys)


NO_EXTRA = ExtraKeys()  # no salt, no LoRA adapter, no multimodal items


# ------------------------------------------------------------------ tokens


def _checked_tokens(tokens: object) -> np.ndarray:
    """Return ``tokens`` if it is a 1-D integer array of ids in [0, 2**31); else raise InvalidTokens."""
    if not isinstance(tokens, np.ndarray):
        raise InvalidTokens(f"must be a numpy array, got {type(tokens).__name__}", dtype=None, shape=None)
    if tokens.dtype.kind not in "iu":
        raise _invalid(tokens, f"dtype must be an integer type, got {tokens.dtype}")
    if tokens.ndim != 1:
        raise _invalid(tokens, f"must be 1-D, got {tokens.ndim}-D")
    if tokens.size == 0:
        return tokens
    bits = 8 * tokens.dtype.itemsize
    signed = tokens.dtype.kind == "i"
    limit = min(TOKEN_ID_LIMIT - 1, 2 ** (bits - 1) - 1 if signed else 2**bits - 1)
    if bits > 31 or signed:  # smaller unsigned types cannot hold a bad id
        as_unsigned = tokens.view(np.dtype(f"u{tokens.dtype.itemsize}").newbyteorder(tokens.dtype.byteorder))
        if int(as_unsigned.max()) > limit:  # one pass: negative ids wrap to huge values
            bad = np.flatnonzero((tokens < 0) | (tokens >= TOKEN_ID_LIMIT))
            first = int(bad[0])
            raise _invalid(tokens, f"token ids must lie in [0, 2**31); {bad.size} do not, the first at index "
                                   f"{first}: {int(tokens[first])}")
    return tokens


def _invalid(tokens: np.ndarray, why: str) -> InvalidTokens:
    """The error for a bad token array, with its dtype and shape (built only on the error path)."""
    return InvalidTokens(why, dtype=str(tokens.dtype), shape=tuple(int(s) for s in tokens.shape))


def _token_bytes(tokens: np.ndarray) -> bytes:
    """The ids as little-endian uint32 bytes (they were checked to fit)."""
    if tokens.dtype in (np.dtype("<u4"), np.dtype("<i4")):
        return tokens.tobytes()
    return tokens.astype("<u4").tobytes()


# ------------------------------------------------------------------ keys


def key_bytes(keys: np.ndarray, i: int) -> bytes:
    """The 16 bytes of key ``i`` (negative ``i`` counts from the end), e.g. a ``parent``."""
    assert keys.ndim == 2 and keys.shape[1] == 2 and keys.dtype.kind == "u" and keys.itemsize == 8
    return np.asarray(keys[i], dtype=KEY_DTYPE).tobytes()


def keys_bytes(keys: np.ndarray) -> tuple[bytes, ...]:
    """The 16 bytes of every key (as ``key_bytes`` gives one), in one conversion."""
    assert keys.ndim == 2 and keys.shape[1] == 2 and keys.dtype.kind == "u" and keys.itemsize == 8
    raw = np.ascontiguousarray(keys, dtype=KEY_DTYPE).tobytes()
    return tuple(raw[i:i + KEY_BYTES] for i in range(0, len(raw), KEY_BYTES))


def keys_as_void(keys: np.ndarray) -> np.ndarray:
    """A ``(n,)`` view of the keys with dtype ``V16``: one scalar per key, for ``==``, ``np.isin``, dicts."""
    assert keys.ndim == 2 and keys.shape[1] == 2 and keys.dtype.kind == "u" and keys.itemsize == 8
    words = np.ascontiguousarray(keys, dtype=KEY_DTYPE)
    return words.view(np.dtype("V16")).reshape(words.shape[0])


# C callables the chain maps over (typed here once; no Python code runs per block).
_concat = cast(Callable[[bytes, bytes], bytes], operator.concat)
_xxh3_128 = cast(Callable[[bytes, int], bytes], xxhash.xxh3_128_digest)
_sha256 = cast(Callable[[bytes], Any], hashlib.sha256)
_digest = cast(Callable[[Any], bytes], operator.methodcaller("digest"))
_first_key_bytes = cast(Callable[[bytes], bytes], operator.itemgetter(slice(0, KEY_BYTES)))


class BlockHasher:
    """Prefix-chained, seeded 128-bit block keys (see the module docstring for the definition).

    One hasher per cache instance: its seed is secret and random unless given
    (give one only to share keys with a persisted cache).  Keys from hashers
    with different seeds, algorithms, ``block_tokens`` or namespaces are
    unrelated.
    """

    __slots__ = ("_algorithm", "_block_tokens", "_contexts", "_namespace", "_row_bytes", "_seed", "_seed_bytes")

    def __init__(self, *, block_tokens: int, seed: int | None = None, algorithm: str = "xxh3_128",
                 namespace: str = "") -> None:
        if isinstance(block_tokens, bool) or not isinstance(block_tokens, int | np.integer):
            raise ConfigError(f"must be an int, got {type(block_tokens).__name__}",
                              source="BlockHasher", key="block_tokens")
        if block_tokens <= 0:
            raise ConfigError(f"must be >= 1, got {block_tokens}", source="BlockHasher", key="block_tokens")
        if algorithm not in ALGORITHMS:
            raise ConfigError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}",
                              source="BlockHasher", key="algorithm")
        if not isinstance(namespace, str):
            raise ConfigError(f"must be a str, got {type(namespace).__name__}", source="BlockHasher",
                              key="namespace")
        if seed is None:
            seed = secrets.randbits(64)
        elif isinstance(seed, bool) or not isinstance(seed, int | np.integer):
            raise ConfigError(f"must be an int or None, got {type(seed).__name__}",
                              source="BlockHasher", key="seed")
        elif not 0 <= seed < SEED_LIMIT:
            raise ConfigError("must lie in [0, 2**64)", source="BlockHasher", key="seed")
        self._block_tokens = int(block_tokens)
        self._row_bytes = TOKEN_BYTES * self._block_tokens
        self._algorithm = algorithm
        self._namespace = namespace
        self._seed = int(seed)
        self._seed_bytes = _le64(self._seed)
        self._contexts: dict[tuple[object, ...], tuple[bytes, int, bytes]] = {}  # _context's answers

    @property
    def block_tokens(self) -> int:
        return self._block_tokens

    @property
    def algorithm(self) -> str:
        return self._algorithm

    @property
    def namespace(self) -> str:
        """What the keys describe (a CacheManager's layout fingerprint): part of every root."""
        return self._namespace

    @property
    def seed(self) -> int:
        """The secret seed (persist it only with the cache it keys; never log it)."""
        return self._seed

    def __repr__(self) -> str:
        return (f"BlockHasher(block_tokens={self._block_tokens}, algorithm={self._algorithm!r}, "
                f"namespace={self._namespace!r})")  # never the seed

    # -------------------------------------------------------------- primitives

    def _keyed(self, message: bytes) -> bytes:
        """``H``: the hasher's keyed 128-bit hash of one message."""
        if self._algorithm == "xxh3_128":
            return bytes(xxhash.xxh3_128_digest(message, self._seed))
        return hashlib.sha256(self._seed_bytes + message).digest()[:KEY_BYTES]

    def _context(self, extra: ExtraKeys) -> tuple[bytes, int, bytes]:
        """(root, xxh3 block seed, sha256 block prefix) for these extras (remembered for the last
        CONTEXT_MEMO salts and adapters: they depend on nothing else)."""
        key = (extra.cache_salt, type(extra.lora_id), extra.lora_id)
        found = self._contexts.get(key)
        if found is None:
            if len(self._contexts) >= CONTEXT_MEMO:
                self._contexts.clear()
            found = self._contexts[key] = self._derive_context(extra)
        return found

    def _derive_context(self, extra: ExtraKeys) -> tuple[bytes, int, bytes]:
        extra_digest = self._keyed(_EXTRA_TAG + extra.shared_encoding())
        root = self._keyed(_DOMAIN + _text(self._algorithm) + _le64(self._block_tokens) + _text(self._namespace)
                           + extra_digest)
        block_seed = int(xxhash.xxh3_64_intdigest(_BLOCK_SEED_TAG + extra_digest, self._seed))
        return root, block_seed, self._seed_bytes + extra_digest

    def _prepare(self, tokens: np.ndarray, extra: ExtraKeys | None, parent: bytes | None,
                 start_block: int) -> tuple[bytes, int, bytes, np.ndarray, int, dict[int, bytes]]:
        """Validate everything (before any hashing) and return the chain's inputs.

        Returns (first parent key, xxh3 block seed, sha256 block prefix, the
        checked tokens, number of complete blocks, item encodings by block index
        relative to ``start_block``).
        """
        if extra is None:
            extra = NO_EXTRA
        elif not isinstance(extra, ExtraKeys):
            raise ConfigError(f"must be ExtraKeys or None, got {type(extra).__name__}",
                              source="BlockHasher.hash_blocks", key="extra")
        if isinstance(start_block, bool) or not isinstance(start_block, int | np.integer) or start_block < 0:
            raise UnitError("start_block must be an int >= 0", name="start_block",
                            value=start_block if isinstance(start_block, int) else -1)
        start_block = int(start_block)
        if parent is None and start_block > 0:
            raise UnitError("continuing a chain at start_block > 0 needs the parent key",
                            name="start_block", value=start_block)
        if parent is not None and start_block == 0:
            raise UnitError("a chain starting at block 0 has no parent key", name="start_block", value=0)
        if parent is not None and (not isinstance(parent, bytes) or len(parent) != KEY_BYTES):
            raise UnitError("parent must be the 16-byte key of block start_block - 1 (key_bytes)",
                            name="parent_bytes",
                            value=len(parent) if isinstance(parent, bytes | bytearray) else -1)
        tokens = _checked_tokens(tokens)
        bt = self._block_tokens
        n_blocks = tokens.shape[0] // bt
        root, block_seed, prefix = self._context(extra)
        by_block: dict[int, list[tuple[int, bytes]]] = {}
        for offset, content in extra.mm_keys:  # sorted, so each block's list is too
            j = offset // bt - start_block
            if 0 <= j < n_blocks:
                by_block.setdefault(j, []).append((offset, content))
        items = {j: _encode_items(block_items) for j, block_items in by_block.items()}
        return root if parent is None else parent, block_seed, prefix, tokens, n_blocks, items

    # -------------------------------------------------------------- hashing

    def hash_blocks(self, tokens: np.ndarray, extra: ExtraKeys | None = None, *,
                    parent: bytes | None = None, start_block: int = 0) -> np.ndarray:
        """Keys of every complete block of ``tokens``: an ``(n_blocks, 2)`` uint64 array.

        ``tokens`` is a 1-D integer array of ids in ``[0, 2**31)`` (else
        ``InvalidTokens``, before anything is hashed), starting at block
        ``start_block`` of the request; a trailing partial block gets no key.
        ``parent`` is the key of block ``start_block - 1`` (required exactly
        when ``start_block > 0``); multimodal offsets in ``extra`` are absolute
        token positions in the request.
        """
        key, block_seed, prefix, tokens, n_blocks, items = self._prepare(tokens, extra, parent, start_block)
        keys = np.empty((n_blocks, 2), dtype=KEY_DTYPE)
        bt, row = self._block_tokens, self._row_bytes
        # Chunks keep every temporary small enough to be reused from one chunk to
        # the next: fresh pages (page faults) cost more than the hashing itself.
        step = max(1, _CHUNK_BYTES // row)
        for c0 in range(0, n_blocks, step):
            c1 = min(n_blocks, c0 + step)
            reader = map(io.BytesIO(_token_bytes(tokens[c0 * bt:c1 * bt])).read, itertools.repeat(row, c1 - c0))
            rows: Iterator[bytes] = reader
            local = sorted(j - c0 for j in items if c0 <= j < c1)
            if local:
                parts: list[Iterator[bytes]] = []
                done = 0
                for j in local:
                    parts.append(itertools.islice(reader, j - done))
                    parts.append(map(_concat, itertools.islice(reader, 1), (items[c0 + j],)))
                    done = j + 1
                parts.append(reader)
                rows = itertools.chain.from_iterable(parts)
            out = [key]
            # Each step reads the previous key from `out` while `extend` appends the new one:
            # list iterators see items appended during iteration, so the chain runs in C.
            chained = map(_concat, iter(out), rows)
            if self._algorithm == "xxh3_128":
                out.extend(map(_xxh3_128, chained, itertools.repeat(block_seed)))
            else:
                messages = map(_concat, itertools.repeat(prefix), chained)
                out.extend(map(_first_key_bytes, map(_digest, map(_sha256, messages))))
            if len(out) != c1 - c0 + 1:  # pragma: no cover - an interpreter whose list.extend differs
                return self.reference_hash_blocks(tokens, extra, parent=parent, start_block=start_block)
            key = out[-1]
            out[0] = b""
            keys[c0:c1] = np.frombuffer(b"".join(out), dtype=KEY_DTYPE).reshape(c1 - c0, 2)
        return keys

    def reference_hash_blocks(self, tokens: np.ndarray, extra: ExtraKeys | None = None, *,
                              parent: bytes | None = None, start_block: int = 0) -> np.ndarray:
        """``hash_blocks`` as the obvious per-block loop: same arguments, errors and results; slower."""
        key, block_seed, prefix, tokens, n_blocks, items = self._prepare(tokens, extra, parent, start_block)
        data = _token_bytes(tokens[:n_blocks * self._block_tokens])
        keys: list[bytes] = []
        row = self._row_bytes
        for j in range(n_blocks):
            message = key + data[j * row:(j + 1) * row] + items.get(j, b"")
            if self._algorithm == "xxh3_128":
                key = bytes(xxhash.xxh3_128_digest(message, block_seed))
            else:
                key = hashlib.sha256(prefix + message).digest()[:KEY_BYTES]
            keys.append(key)
        return np.frombuffer(b"".join(keys), dtype=KEY_DTYPE).reshape(n_blocks, 2).copy()


def checked_tokens(tokens: object) -> np.ndarray:
    """Public form of the token-array check: the array itself, or InvalidTokens with fields."""
    return _checked_tokens(tokens)
