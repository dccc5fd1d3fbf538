"""Reading vLLM's test results (JUnit XML) and classifying what fails only with hkv.

Each test that passes with vLLM's own manager and fails with hkv's gets one
reason class, read off its failure message:

- `not served yet: FEATURE`: the adapter refused a configuration it does not
  serve (UnsupportedVllmConfig names the feature: lookahead, KV connector,
  hybrid groups, ...);
- `reads vLLM internals`: the test reads an attribute of vLLM's own manager,
  coordinator or block pool that the adapter does not model;
- `asserts a vLLM block id`: the test compares block ids or block objects,
  which hkv hands out in its own order;
- a known difference (`KNOWN_DIFFERENCES`, each read and explained in
  docs/vllm.md): `vLLM's block hashes` (the test compares a block's hash
  with vLLM's own hash function), chunked local attention served as a
  window (hkv drops fewer blocks), and above all `visibility`, a test that expects a block to be
  a hit (or an event) right after `allocate_slots`, before anything reports
  its tokens computed - hkv caches a block once it is computed;
- `behaviour difference`: anything else (what is scheduled, computed-token
  counts, hits): each one is listed by name for a person to read.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

import attrs

INTERNAL_VIEWS = ("BlockPoolView", "CoordinatorView", "FreeQueueView", "GroupView", "HkvKVCacheManager")
UNSUPPORTED = re.compile(r"UnsupportedVllmConfig: vLLM config: ([A-Za-z_\[\]0-9]+):")
BLOCK_ID_HINTS = ("KVCacheBlock(", "block_id", "get_block_ids", "blocks[", "req_to_blocks")
INTERNALS = "reads vLLM internals"
VISIBILITY = "visibility: expects a block cached when allocated (hkv: once computed)"
BLOCK_IDS = "asserts a vLLM block id"
CHUNK_WINDOW = ("chunked local attention as a window: hkv keeps the blocks of the last chunk-size tokens, vLLM "
                "only the current chunk's")
BLOCK_HASHES = "vLLM's block hashes: compares a block's block_hash with vLLM's hash (hkv keys blocks itself)"
KNOWN_DIFFERENCES = {  # test (without parameters) -> the reason it fails with hkv, read from the test
    "test_kv_cache_events": VISIBILITY,
    "test_kv_connector_basic": VISIBILITY,  # counts a request's cached blocks right after scheduling
    "test_kv_cache_events_with_lora": VISIBILITY,
    "test_block_stored_event_session_id": VISIBILITY,
    "test_computed_blocks_not_evicted": VISIBILITY,
    "test_reset_prefix_cache": VISIBILITY,
    "test_session_id_does_not_affect_prefix_cache_identity": VISIBILITY,
    "test_prefix_caching_for_prefill_dedup": VISIBILITY,  # two equal prompts in one step share blocks in vLLM
    "test_prefill_hybrid_model_combinations": VISIBILITY,  # hybrid groups: a hit right after allocate_slots
    "test_swa_shared_prefix_reuse_under_zero_retention": VISIBILITY,
    "test_prefill_hybrid_model_combinations_eagle": VISIBILITY,  # EAGLE: a primed cache never reported computed
    "test_eagle_enabled_removes_last_block": VISIBILITY,
    "test_eagle_with_partial_blocks": VISIBILITY,
    "test_eagle_with_sliding_window": VISIBILITY,
    "test_eagle_swa_alignment_caches_extra_block": VISIBILITY,  # block sizes differ: a primed cache never computed
    "test_swa_free_split_keeps_cached_tail_ahead_of_scratch": VISIBILITY,  # block hashes set at allocation
    "test_different_block_size": BLOCK_IDS,  # the window group's ids 5..11 (hkv: that group's share, 50..56)
    "test_chunked_local_free_waits_for_in_flight_step": CHUNK_WINDOW,  # 4 blocks dropped where vLLM drops 6
    "test_pure_swa_retention_interval_caches_sparse_tails": INTERNALS,  # asserts vLLM's coordinator class
    "test_prefill": BLOCK_HASHES,  # block_pool.blocks[i].block_hash == vLLM's hash_block_tokens(...)
    "test_prefill_plp": BLOCK_HASHES,
    "test_mm_prefix_caching": "token ids: the test's placeholder tokens are -1, outside hkv's [0, 2**31)",
    "test_positive_retention_rejects_full_attention": "a vLLM option the adapter ignores (retention_interval)",
}


@attrs.frozen(kw_only=True)
class Outcome:
    """One test case: its file, name, and failure message (None when it passed; 'skipped' when skipped)."""

    file: str
    name: str
    failure: str | None
    skipped: bool = False

    @property
    def passed(self) -> bool:
        return self.failure is None and not self.skipped


def read_junit(path: Path) -> dict[str, Outcome]:
    """Test id (file::name) -> outcome, from pytest's `--junitxml` file."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.attrib.get("classname", "")
        file = module.rsplit(".", 1)[-1] + ".py" if module else "?"
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        message = None if bad is None else (bad.attrib.get("message") or bad.text or "failed")
        outcome = Outcome(file=file, name=case.attrib["name"], failure=message,
                          skipped=case.find("skipped") is not None)
        outcomes[f"{file}::{outcome.name}"] = outcome
    return outcomes


def reason_class(message: str, name: str = "") -> str:
    """The reason class of a failure of test `name` that happens only with hkv."""
    found = UNSUPPORTED.search(message)  # a refusal first: a known test may be refused in some parameters
    if found:
        return f"not served yet: {found.group(1).split('[')[0]}"
    known = KNOWN_DIFFERENCES.get(name.split("[")[0])
    if known is not None:
        return known
    if "AttributeError" in message and any(f"'{view}' object" in message for view in INTERNAL_VIEWS):
        return INTERNALS
    if any(hint in message for hint in BLOCK_ID_HINTS):
        return BLOCK_IDS
    return "behaviour difference"


@attrs.frozen(kw_only=True)
class Comparison:
    """Pass counts per file, stock and with hkv, and the classes of hkv-only failures."""

    files: tuple[str, ...]
    stock: dict[str, tuple[int, int]]   # file -> (passed, run)
    hkv: dict[str, tuple[int, int]]
    classes: dict[str, int]
    differences: tuple[str, ...]        # tests of class "behaviour difference"
    hkv_only_passes: tuple[str, ...]    # tests that fail stock and pass with hkv


def compare(stock: dict[str, Outcome], hkv: dict[str, Outcome]) -> Comparison:
    files = tuple(sorted({o.file for o in stock.values()} | {o.file for o in hkv.values()}))
    classes: Counter[str] = Counter()
    differences, better = [], []
    for test_id, mine in sorted(hkv.items()):
        theirs = stock.get(test_id)
        if theirs is None:
            continue
        if theirs.passed and not mine.passed and not mine.skipped:
            kind = reason_class(mine.failure or "", mine.name)
            classes[kind] += 1
            if kind == "behaviour difference":
                differences.append(test_id)
        elif mine.passed and not theirs.passed:
            better.append(test_id)
    return Comparison(files=files, stock=_counts(stock, files), hkv=_counts(hkv, files), classes=dict(classes),
                      differences=tuple(differences), hkv_only_passes=tuple(better))


def _counts(outcomes: dict[str, Outcome], files: tuple[str, ...]) -> dict[str, tuple[int, int]]:
    counts = {}
    for file in files:
        mine = [o for o in outcomes.values() if o.file == file and not o.skipped]
        counts[file] = (sum(o.passed for o in mine), len(mine))
    return counts
