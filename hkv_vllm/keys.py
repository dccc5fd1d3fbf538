"""What of a vLLM request goes into hkv's block keys besides its tokens.

vLLM's block hash covers the tokens and extra keys: the LoRA adapter, the
multimodal items a block overlaps (by their content hash and offset), the
request's `cache_salt` and, for a prompt given as embeddings, the digest of
the block's embeddings.  hkv's keys take the same
(`CacheManager.add_request(cache_salt=, lora_id=, mm_keys=)`, the embeddings
as items), so two requests share a cached block in hkv exactly when they
would in vLLM.

Prompt embeddings: vLLM stores `[0] * n` as the token ids of a request made
from `prompt_embeds` (and 0 at the embedded positions of a mixed prompt), so
its tokens say nothing of its input; vLLM keys every hash block by the
SHA-256 of the block's rows of `prompt_embeds` (`_gen_prompt_embeds_extra_hash_keys`,
the rows past the prompt being none).  hkv mixes an item into the key of the
one block holding its offset (and, through the chain, every later one), so
the adapter gives one item per hkv block of the prompt, at the block's first
token, holding the digest of the embeddings of all its rows: every row's
embedding keys the block holding it, and requests whose embeddings agree on
a prefix of blocks share those blocks.
"""

from __future__ import annotations

import hashlib
from typing import Any

EMBEDS_TAG = b"\xfeembeds\x00"  # 0xfe: in no UTF-8 text (multimodal identifiers), unlike 0xff (out-of-range ids)


def request_keys(request: Any, block_tokens: int
                 ) -> tuple[str | None, str | int | None, tuple[tuple[int, bytes], ...]]:
    """(cache_salt, lora_id, mm_keys) of a vLLM `Request` for `CacheManager.add_request`, hkv's block being
    `block_tokens` tokens."""
    lora = request.lora_request
    lora_id = None if lora is None else lora.lora_name  # vLLM hashes the adapter's name
    mm_keys = tuple((int(f.mm_position.offset), str(f.identifier).encode())
                    for f in (request.mm_features or ()))
    return request.cache_salt, lora_id, mm_keys + prompt_embeds_items(request, block_tokens)


def prompt_embeds_items(request: Any, block_tokens: int) -> tuple[tuple[int, bytes], ...]:
    """One item per `block_tokens` block of the request's `prompt_embeds` (none without): at the block's first
    token, `EMBEDS_TAG`, the dtype and shape of the block's rows (the last block's may be fewer), and the
    SHA-256 of their bytes as vLLM hashes them (`vllm.v1.utils.tensor_data`; the digest vLLM cached on the
    request for the same rows is taken as it is)."""
    embeds = getattr(request, "prompt_embeds", None)
    if embeds is None:
        return ()
    from vllm.v1.utils import tensor_data

    memo = getattr(request, "_prompt_embeds_per_block_hashes", None)
    memo = memo if isinstance(memo, dict) else {}
    items = []
    for lo in range(0, int(embeds.shape[0]), block_tokens):
        rows = embeds[lo:lo + block_tokens]
        digest = memo.get((lo, lo + block_tokens))  # vLLM's key: (block start, block end), rows clipped to n
        if not isinstance(digest, bytes):
            digest = hashlib.sha256(tensor_data(rows)).digest()
        form = f"{rows.dtype} {tuple(int(s) for s in rows.shape)}".encode()
        items.append((lo, EMBEDS_TAG + len(form).to_bytes(2, "little") + form + digest))
    return tuple(items)
