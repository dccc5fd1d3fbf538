"""What of a vLLM request goes into hkv's block keys besides its tokens.

vLLM's block hash covers the tokens and extra keys: the LoRA adapter, the
multimodal items a block overlaps (by their content hash and offset) and
the request's `cache_salt`.  hkv's keys take the same three
(`CacheManager.add_request(cache_salt=, lora_id=, mm_keys=)`), so two
requests share a cached block in hkv exactly when they would in vLLM.
"""

from __future__ import annotations

from typing import Any


def request_keys(request: Any) -> tuple[str | None, str | int | None, tuple[tuple[int, bytes], ...]]:
    """(cache_salt, lora_id, mm_keys) of a vLLM `Request` for `CacheManager.add_request`."""
    lora = request.lora_request
    lora_id = None if lora is None else lora.lora_name  # vLLM hashes the adapter's name
    mm_keys = tuple((int(f.mm_position.offset), str(f.identifier).encode())
                    for f in (request.mm_features or ()))
    return request.cache_salt, lora_id, mm_keys
