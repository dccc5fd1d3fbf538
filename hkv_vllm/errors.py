"""Errors of the vLLM adapter, in hkv's one HkvError hierarchy."""

from __future__ import annotations

from hkv_core.errors import ConfigError


class UnsupportedVllmConfig(ConfigError):
    """A vLLM configuration the adapter does not serve yet: ``feature`` names it, ``detail`` says why.

    Raised when the scheduler builds its KV cache manager, before anything is
    allocated: a KV cache group whose spec hkv has no layout for, speculative
    lookahead or async scheduling (slots for tokens not yet known), a KV
    connector.  docs/vllm.md lists what is served.
    """

    def __init__(self, *, feature: str, detail: str) -> None:
        super().__init__(f"not supported by hkv_vllm yet: {detail}", source="vLLM config", key=feature)
        self.feature, self.detail = feature, detail
        self.fields.update(feature=feature, detail=detail)
