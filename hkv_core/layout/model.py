"""``Layout``: a model's whole cache geometry, immutable once built."""

from __future__ import annotations

import hashlib
import os
import reprlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from hkv_core.errors import ConfigError
from hkv_core.layout.bounds import WINDOW_TOKENS_MAX
from hkv_core.layout.build import build_groups, build_pools
from hkv_core.layout.config import ModelConfig, parse_config
from hkv_core.layout.hf_source import config_mapping
from hkv_core.layout.kinds import ObjectKind
from hkv_core.layout.presets import load_preset_config
from hkv_core.layout.records import LayerGroup, PoolSpec


@attrs.frozen(kw_only=True)
class Layout:
    """Layer groups and pool specs of one model.

    ``groups`` / ``pools`` cover the main layers (ids ``0 .. main_layers - 1``);
    ``mtp_groups`` / ``mtp_pools`` the MTP (draft) layers that follow, whose
    state is needed only when speculating.  ``model_type`` is the config's HF
    type, ``family`` how it caches (``deepseek_v4``, ``mla``, ``standard``: see
    ``docs/models.md``).  ``num_key_value_heads`` and ``head_dim`` describe one
    cached token: for V4 and MLA one latent of ``head_dim`` values (MLA:
    ``kv_lora_rank + qk_rope_head_dim``), else K and V per KV head.
    ``window_tokens`` is the model's largest sliding window (0: none).  Built
    only by ``from_hf_config`` / ``from_preset`` / ``from_layer_windows``, or
    by ``hkv_core.layout.engine_layout`` for an engine's own cache groups,
    after full validation.
    """

    name: str
    source: str
    model_type: str
    family: str
    main_layers: int
    mtp_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope_head_dim: int
    vocab_size: int
    kv_dtype: str
    window_tokens: int
    block_tokens: int
    alignment_bytes: int
    groups: tuple[LayerGroup, ...]
    mtp_groups: tuple[LayerGroup, ...]
    pools: tuple[PoolSpec, ...]
    mtp_pools: tuple[PoolSpec, ...]

    def __attrs_post_init__(self) -> None:
        main_ids = sorted(i for group in self.groups for i in group.layer_ids)
        mtp_ids = sorted(i for group in self.mtp_groups for i in group.layer_ids)
        assert main_ids == list(range(self.main_layers)), main_ids
        assert mtp_ids == list(range(self.main_layers, self.main_layers + self.mtp_layers))
        names = [pool.name for pool in self.all_pools]
        assert len(set(names)) == len(names), names
        assert {p.group_name for p in self.all_pools} == {g.name for g in self.all_groups}

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any] | str | os.PathLike[str] | object,
        *,
        name: str,
        block_tokens: int | None = None,
        source: str | None = None,
    ) -> Layout:
        """Build from a Hugging Face style config (raises ``ConfigError``): a config.json dict, the path of a
        config.json (or its directory), or a transformers config object (``DeepseekV4Config``,
        ``LlamaConfig``, ...: anything with ``to_dict()``; hkv_core.layout.hf_source translates its names).

        The config must name a supported ``model_type``; every size in it is
        bounded and checked before anything is built (``docs/models.md``).
        ``block_tokens`` overrides the config's ``hkv.block_tokens`` (default 256);
        ``source`` names the config in errors (default: ``name``).  ``name`` must be a non-empty str and
        ``source`` None or a non-empty str (ConfigError, key ``name`` / ``source``): the name is part of every
        block key's root (`fingerprint`).
        """
        for key, value in (("name", name), ("source", source)):
            if (value is not None or key == "name") and (not isinstance(value, str) or not value.strip()):
                got = f"got {type(value).__name__}" if not isinstance(value, str) else f"got {value!r}"
                raise ConfigError(f"must be a non-empty str{' or None' if key == 'source' else ''}, {got}",
                                  source="Layout.from_hf_config", key=key)
        mapping = config_mapping(config, source or name)
        return cls._from_model_config(parse_config(mapping, name=name, source=source or name,
                                                   block_tokens=block_tokens))

    @classmethod
    def from_layer_windows(cls, config: Mapping[str, Any], layer_windows: Sequence[int], *, name: str,
                           source: str | None = None) -> Layout:
        """A standard-family layout whose layers' sliding windows are given one per layer (0: full attention),
        as an engine lays out a model whose sliding layers differ in window (vLLM's KV cache groups).

        `config` is read as by `from_hf_config` and must be a `gpt_oss` config (its `layer_types` and
        `sliding_window` describe the layers); `layer_windows` then sets each main layer's window: one entry
        per layer, 0 exactly where `layer_types` says full attention, else in [2, the limit of
        `sliding_window`] (ConfigError, key `layer_windows`)."""
        layout = cls.from_hf_config(config, name=name, source=source)
        where = source or name
        windows = tuple(layer_windows)
        kinds = tuple(w > 0 for w in layout_windows(layout))
        if (layout.model_type != "gpt_oss" or len(windows) != layout.main_layers
                or any(type(w) is not int or w == 1 or not 0 <= w <= WINDOW_TOKENS_MAX for w in windows)
                or tuple(w > 0 for w in windows) != kinds):
            raise ConfigError(f"must list one window per main layer ({layout.main_layers}), 0 exactly at the "
                              f"full-attention layers of a gpt_oss config and else in [2, {WINDOW_TOKENS_MAX}]; "
                              f"got {reprlib.repr(windows)} for a {layout.model_type!r} config",
                              source=where, key="layer_windows")
        cfg = parse_config(config_mapping(config, where), name=name, source=where)
        geometry = attrs.evolve(cfg.geometry, window_tokens=max(windows),
                                layer_windows=windows + cfg.geometry.layer_windows[len(windows):])
        return cls._from_model_config(attrs.evolve(cfg, geometry=geometry))

    @classmethod
    def _from_model_config(cls, cfg: ModelConfig) -> Layout:
        groups, mtp_groups = build_groups(cfg, draft=False), build_groups(cfg, draft=True)
        g = cfg.geometry
        return cls(
            name=cfg.name, source=cfg.source, model_type=cfg.model_type, family=g.family.value,
            main_layers=cfg.main_layers,
            mtp_layers=cfg.mtp_layers, hidden_size=cfg.hidden_size,
            num_attention_heads=cfg.num_attention_heads, num_key_value_heads=g.num_key_value_heads,
            head_dim=g.head_dim, rope_head_dim=g.rope_head_dim, vocab_size=cfg.vocab_size,
            kv_dtype=cfg.kv_dtype, window_tokens=g.window_tokens, block_tokens=cfg.block_tokens,
            alignment_bytes=cfg.alignment_bytes, groups=groups, mtp_groups=mtp_groups,
            pools=build_pools(cfg, groups), mtp_pools=build_pools(cfg, mtp_groups),
        )

    @classmethod
    def from_preset(cls, name: str, *, block_tokens: int | None = None) -> Layout:
        """Build from ``specs/presets/NAME.toml`` (``ConfigError`` lists presets if unknown)."""
        return cls.from_hf_config(load_preset_config(name), name=name, block_tokens=block_tokens)

    def fingerprint(self) -> str:
        """A digest (32 hex digits) of what decides the bytes cached per block: the name, model type and family,
        block size, KV dtype, window, and every pool's ABI id, layers and page geometry (not ``source``, where
        the config was read).  A CacheManager puts it into every block key's root: two layouts never share a
        key, even with one seed."""
        parts = [self.name, self.model_type, self.family, str(self.block_tokens), self.kv_dtype,
                 str(self.window_tokens)]
        parts += [f"{p.name}|{p.abi_id}|{p.layer_count}|{p.tokens_per_page}|{p.compress_ratio}"
                  for p in self.all_pools]
        return hashlib.blake2b("\n".join(parts).encode(), digest_size=16).hexdigest()

    @property
    def all_groups(self) -> tuple[LayerGroup, ...]:
        """Main groups, then MTP groups."""
        return self.groups + self.mtp_groups

    @property
    def all_pools(self) -> tuple[PoolSpec, ...]:
        """Main pools, then MTP pools."""
        return self.pools + self.mtp_pools

    def group(self, name: str) -> LayerGroup:
        """The group called ``name`` (``KeyError`` if none)."""
        found = [group for group in self.all_groups if group.name == name]
        if not found:
            raise KeyError(name)
        return found[0]

    def group_of_layer(self, layer_id: int) -> LayerGroup:
        """The group holding layer ``layer_id`` (``KeyError`` if none)."""
        found = [group for group in self.all_groups if layer_id in group.layer_ids]
        if not found:
            raise KeyError(layer_id)
        return found[0]

    def pool(self, name: str) -> PoolSpec:
        """The pool called ``name`` (``KeyError`` if none)."""
        found = [pool for pool in self.all_pools if pool.name == name]
        if not found:
            raise KeyError(name)
        return found[0]

    def pools_of(self, group_name: str) -> tuple[PoolSpec, ...]:
        """The pools of group ``group_name``, in layout order."""
        return tuple(pool for pool in self.all_pools if pool.group_name == group_name)

    def object_kinds(self) -> tuple[ObjectKind, ...]:
        """The object kinds the main layers use, in ``ObjectKind`` order."""
        used = {pool.object_kind for pool in self.pools}
        return tuple(kind for kind in ObjectKind if kind in used)

    def bytes_per_token(self, object_kind: ObjectKind) -> float:
        """Bytes per covered token of one object kind, summed over all main layers.

        Compressed entries count ``entry_bytes / r`` per token, rows (tail,
        window) their full width: the density of the pool contents, not the
        bounded size of one resume point (see ``resume_requirements``).
        """
        return sum(p.bytes_per_token for p in self.pools if p.object_kind is object_kind)

    def recurrent_state_bytes(self) -> int:
        """Bytes of the recurrent state of every main linear layer at one resume point (0 without any): what
        each retained point of a hybrid keeps besides its per-token KV, whatever its length."""
        return sum(g.state.bytes_per_layer * g.layer_count for g in self.groups if g.state is not None)


def layout_windows(layout: Layout) -> tuple[int, ...]:
    """The sliding window of each main layer (0: none), in layer order."""
    windows = dict.fromkeys(range(layout.main_layers), 0)
    for group in layout.groups:
        for layer in group.layer_ids:
            windows[layer] = group.window_tokens
    return tuple(windows[i] for i in range(layout.main_layers))
