"""One serving instance in a process of its own, sharing a remote tier: `python -m hkv_exec_ref.demo.remote_instance`.

The parent (`InstanceProcess`) starts it with a JSON job in argv - `{"remote": {...RemoteTierConfig fields},
"engine": {...Engine.tiny arguments}}` - and sends one JSON line per request on stdin:
`{"prompt": [...], "max_new_tokens": n, "salt": null}`.  The instance serves it, checks it against a full
recomputation, waits until the records it published are in the store, and answers one JSON line:
`{"cached_by_tier": {...}, "exact": true, "tokens": [...], "logits_digest": "..."}`.  `{"report": true}` answers
with the tier cache's report; end of input closes the engine (its segment leaves the store) and exits.  An error
is answered as `{"error": type, "message": ...}` and ends the process with status 1.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import numpy as np
import xxhash

from hkv_exec_ref.engine import Engine
from hkv_tiers.remote_config import RemoteTierConfig


def _answer(engine: Engine, request: dict[str, Any]) -> dict[str, Any]:
    if request.get("report"):
        assert engine.tiers is not None
        return {"report": engine.tiers.cache.report(), "cost": {t: [r.value, r.latency_s, r.measured]
                                                                for t, r in engine.tiers.cost.tiers.items()}}
    prompt = np.asarray(request["prompt"], np.int64)
    served = engine.generate(prompt, int(request["max_new_tokens"]), cache_salt=request.get("salt"))
    assert engine.tiers is not None and engine.tiers.cache.remote is not None
    engine.tiers.cache.remote.drain(timeout_s=10.0)  # what it published is in the store before it answers
    return {"cached_by_tier": served.cached_by_tier, "cached_tokens": served.cached_tokens,
            "exact": engine.matches_recompute(prompt, served), "tokens": served.tokens.tolist(),
            "logits_digest": xxhash.xxh3_128_hexdigest(np.ascontiguousarray(served.logits).tobytes())}


def main(argv: list[str] | None = None) -> int:
    job = json.loads((argv if argv is not None else sys.argv[1:])[0])
    try:
        engine = Engine.tiny(remote=RemoteTierConfig(**job["remote"]), **job["engine"])
    except Exception as err:
        print(json.dumps({"error": type(err).__name__, "message": str(err)}), flush=True)
        return 1
    with engine:
        for line in sys.stdin:
            try:
                answer = _answer(engine, json.loads(line))
            except Exception as err:
                print(json.dumps({"error": type(err).__name__, "message": str(err)}), flush=True)
                return 1
            print(json.dumps(answer), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
