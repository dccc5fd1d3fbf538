"""Reading vLLM's test results (JUnit XML) and classifying what fails only with hkv.

Each test that passes with vLLM's own manager and fails with hkv's gets one
reason class, read off its failure message:

- `not served yet: FEATURE`: the adapter refused a configuration it does not
  serve (UnsupportedVllmConfig names the feature: context parallelism, V4.1's
  bounded replay, a group of a spec it does not serve - `kv_cache_groups
  (MambaSpec)` -, ...);
- `reads vLLM internals`: the test reads an attribute of vLLM's own manager,
  coordinator or block pool that the adapter does not model;
- `asserts a vLLM block id`: the test compares block ids or block objects,
  which hkv hands out in its own order;
- a known difference (`KNOWN_DIFFERENCES`, each read from the test, most
  explained in docs/vllm.md): `vLLM's block hashes` (the test reads a block's
  block_hash, vLLM's own hash), chunked local attention served as a window
  (hkv drops fewer blocks), vLLM's retention_interval (ignored: hkv hits what
  vLLM hits without it), a request of no tokens (an empty prompt, which
  vLLM's front end refuses), and above all `visibility`, a test that expects
  a block to be a hit (or an event) right after `allocate_slots`, before
  anything reports its tokens computed - hkv caches a block once it is
  computed;
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
REFUSED_SPEC = re.compile(r"not supported by hkv_vllm yet: an? ([A-Za-z0-9]+Spec) group")
BLOCK_ID_HINTS = ("KVCacheBlock(", "block_id", "get_block_ids", "blocks[", "req_to_blocks")
INTERNALS = "reads vLLM internals"
VISIBILITY = "visibility: expects a block cached when allocated (hkv: once computed)"
BLOCK_IDS = "asserts a vLLM block id"
CHUNK_WINDOW = ("chunked local attention as a window: hkv keeps the blocks of the last chunk-size tokens, vLLM "
                "only the current chunk's")
BLOCK_HASHES = ("vLLM's block hashes: reads a block's block_hash, vLLM's hash of its tokens (hkv keys blocks itself "
                "and never sets it)")
RETENTION = "a vLLM option the adapter ignores (retention_interval)"
EMPTY_PROMPT = ("an empty prompt: the test allocates slots for a request of no tokens, which vLLM's front end "
                "refuses (hkv holds no request without a token: allocate_slots answers None)")
COORDINATOR_CLASS = "reads vLLM internals"  # asserts the class of vLLM's own coordinator
SUB_BLOCK_CHECKPOINT = ("not served yet: a prefill checkpoint inside a state block (hkv keeps the in-kernel "
                        "checkpoints that end a block; vLLM reserves a block for one inside a block too)")
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
    "test_effective_attention_block_size_matches_events": VISIBILITY,  # a BlockStored event right after allocate
    "test_allocate_with_lookahead": EMPTY_PROMPT,  # prompt_token_ids=[], then allocate_slots(request, 3, ...)
    "test_different_block_size": VISIBILITY,  # ids match (one block space); then a hit right after allocate_slots
    "test_prefill_not_enough_free_blocks_with_computed_blocks": VISIBILITY,  # req0 never computed, req1 a hit
    "test_chunked_local_free_waits_for_in_flight_step": CHUNK_WINDOW,  # 4 blocks dropped where vLLM drops 6
    "test_pure_swa_retention_interval_caches_sparse_tails": INTERNALS,  # asserts vLLM's coordinator class
    "test_prefill": BLOCK_HASHES,  # block_pool.blocks[i].block_hash == vLLM's hash_block_tokens(...)
    "test_prefill_plp": BLOCK_HASHES,
    "test_prefill_hybrid_model": BLOCK_HASHES,  # ids match; then block_pool.blocks[i].block_hash is not None
    "test_prefill_hybrid_model_eagle": BLOCK_HASHES,
    "test_decode": BLOCK_HASHES,  # req_to_blocks[...][-2].block_hash is not None right after allocate_slots
    "test_mm_prefix_caching": "token ids: the test's placeholder tokens are -1, outside hkv's [0, 2**31)",
    "test_positive_retention_rejects_full_attention": RETENTION,
    # retention_interval=1024 keeps window tails every 1024 tokens: vLLM hits 1024 of 1800, hkv 1792 - what vLLM
    # itself hits without the option (the same blocks per group)
    "test_hybrid_local_kv_retention_interval_survives_recycling": RETENTION,
    # Mamba groups: a hit on a block allocated but never reported computed; vLLM's coordinator's class
    "test_hybrid_cache_mamba_align_shared_prefix_detection": VISIBILITY,
    "test_mamba_shared_prefix_reuse_under_zero_retention": VISIBILITY,
    "test_hybrid_per_group_hit_divergence_with_connector": COORDINATOR_CLASS,  # isinstance HybridKVCacheCoordinator
    "test_hybrid_fa_deeper_hit_respects_connector_lookup_policy": COORDINATOR_CLASS,
    # sub-block state hits: a producer allocates up to the prompt's tail inside a state block and is freed without
    # a step reported computed; then a hit there
    "test_truncate_computed_blocks_preserves_sparse_prefix_positions": VISIBILITY,
    "test_truncate_computed_blocks_allows_short_mamba_group_only": VISIBILITY,
    "test_opted_out_scratch_group_keeps_partial_hash_hits": VISIBILITY,
    # a hit, in the step it is scheduled, on the state inside a block that the producer's step is copying: hkv keeps
    # the point once that step ran (vLLM indexes it at once and refuses the allocation until the next step)
    "test_hybrid_mamba_moved_partial_entry_defers_same_step_hit": VISIBILITY,
    "test_intermediate_chunk_checkpoint_reserved_only_under_dense_retention": SUB_BLOCK_CHECKPOINT,
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
    """Test id (file::name, file::Class::name for a test in a class) -> outcome, from pytest's `--junitxml` file."""
    outcomes: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        file, classes = _file_and_classes(case.attrib.get("classname", ""))
        bad = case.find("failure")
        bad = bad if bad is not None else case.find("error")
        message = None if bad is None else (bad.attrib.get("message") or bad.text or "failed")
        outcome = Outcome(file=file, name=case.attrib["name"], failure=message,
                          skipped=case.find("skipped") is not None)
        outcomes["::".join((file, *classes, outcome.name))] = outcome
    return outcomes


def _file_and_classes(classname: str) -> tuple[str, tuple[str, ...]]:
    """pytest's dotted classname (package.module[.Class...]) -> the module's file name and the classes."""
    if not classname:
        return "?", ()
    parts = classname.split(".")
    modules = [i for i, part in enumerate(parts) if part.startswith("test_")]
    at = modules[-1] if modules else len(parts) - 1
    return parts[at] + ".py", tuple(parts[at + 1:])


def reason_class(message: str, name: str = "") -> str:
    """The reason class of a failure of test `name` that happens only with hkv."""
    found = UNSUPPORTED.search(message)  # a refusal first: a known test may be refused in some parameters
    if found:
        spec = REFUSED_SPEC.search(message)  # a group refused for its spec: the spec by name
        return f"not served yet: {found.group(1).split('[')[0]}" + (f" ({spec.group(1)})" if spec else "")
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
