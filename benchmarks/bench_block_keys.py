"""Block-key hashing speed: 1,048,576 tokens, block_tokens=16 (65,536 keys).

Prints the median over 7 runs for each algorithm and, measured in the same
process as a baseline, one plain ``xxhash.xxh3_128_intdigest`` over the whole
4 MiB token buffer (no chaining, no per-block keys); ratio = ours / baseline.
For reference: vLLM takes about 210 ms for this prompt, SGLang about 25 ms.
Benchmarks print; they never assert timings.

    .venv/bin/python benchmarks/bench_block_keys.py [--tokens N] [--block-tokens B] [--runs R]
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time
from collections.abc import Callable

import numpy as np
import xxhash

from hkv_core.block_keys import ALGORITHMS, BlockHasher, ExtraKeys


def median_ms(fn: Callable[[], object], runs: int) -> tuple[float, float]:
    """Median wall-clock and median CPU (process) time in ms; CPU time shows contention on shared hosts."""
    fn()  # warm-up
    wall, cpu = [], []
    for _ in range(runs):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return statistics.median(wall) * 1e3, statistics.median(cpu) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1 << 20)
    parser.add_argument("--block-tokens", type=int, default=16)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 2**31, size=args.tokens, dtype=np.int64)
    buffer = tokens.astype("<u4").tobytes()
    seed = 0x5EED
    extra = ExtraKeys(cache_salt="tenant-a", lora_id=7)

    baseline, baseline_cpu = median_ms(lambda: xxhash.xxh3_128_intdigest(buffer, seed), args.runs)
    n_blocks = args.tokens // args.block_tokens
    print(f"{args.tokens} tokens, block_tokens={args.block_tokens} ({n_blocks} keys), "
          f"median of {args.runs} runs (wall clock; cpu = process time)")
    print(f"  {'baseline xxh3_128 (one call, 4 B/token)':<44} {baseline:8.2f} ms   (cpu {baseline_cpu:7.2f} ms)")
    for algorithm in ALGORITHMS:
        hasher = BlockHasher(block_tokens=args.block_tokens, seed=seed, algorithm=algorithm)
        for label, dtype, ex in (("int64 tokens", np.int64, None), ("int32 tokens", np.int32, None),
                                 ("int64 tokens + salt/lora", np.int64, extra)):
            toks = tokens.astype(dtype)
            ms, cpu = median_ms(functools.partial(hasher.hash_blocks, toks, ex), args.runs)
            print(f"  {algorithm + ' ' + label:<44} {ms:8.2f} ms   (cpu {cpu:7.2f} ms)   "
                  f"ratio {ms / baseline:7.1f}x")


if __name__ == "__main__":
    main()
