"""vLLM's own tests as hkv's external suite: the hub cache they need, the swap plugin, the runner."""
