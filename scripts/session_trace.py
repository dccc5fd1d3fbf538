"""Write the second synthetic trace (multi-turn sessions with long gaps, many one-shots) as Mooncake JSON lines.

    .venv/bin/python scripts/session_trace.py out/session_trace.jsonl [--seed N]
    hkv replay out/session_trace.jsonl --sweep --policy lru --policy belady --policy adaptive

The shape: hkv_core/replay/synthetic.py (SessionTraceConfig's defaults).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hkv_core.replay.synthetic import SessionTraceConfig, session_trace, write_trace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.path.parent.mkdir(parents=True, exist_ok=True)
    requests = session_trace(SessionTraceConfig(), args.seed)
    write_trace(requests, args.path)
    print(f"{len(requests):,} requests -> {args.path}")


if __name__ == "__main__":
    main()
