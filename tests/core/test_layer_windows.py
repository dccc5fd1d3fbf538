"""`Layout.from_layer_windows`: a gpt_oss-style layout whose sliding layers differ in window."""

import pytest

from hkv_core.errors import ConfigError
from hkv_core.layout import Layout
from hkv_core.manager import CacheManager, ManagerConfig


def config(types):
    return {"model_type": "gpt_oss", "num_hidden_layers": len(types), "hidden_size": 64, "num_attention_heads": 1,
            "num_key_value_heads": 1, "head_dim": 64, "vocab_size": 2, "torch_dtype": "float32",
            "layer_types": [("sliding" if t else "full") + "_attention" for t in types], "sliding_window": 64,
            "hkv": {"block_tokens": 16, "alignment_bytes": 16}}


def test_each_window_is_its_own_group_and_pool():
    got = Layout.from_layer_windows(config([0, 1, 0, 1]), [0, 32, 0, 64], name="x")
    assert {g.name: (g.layer_ids, g.window_tokens) for g in got.groups} == {
        "swa_r0_w32": ((1,), 32), "swa_r0_w64": ((3,), 64), "full": ((0, 2), 0)}
    assert got.window_tokens == 64
    assert [p.tokens_per_page for p in got.pools] == [16, 16, 16]
    # the windows are what a hit needs: a 100-token prefix resumes with 31 and 63 rows of window
    m = CacheManager(got, ManagerConfig(pool_pages={p.name: 40 for p in got.pools}, max_requests=4,
                                        max_request_tokens=512, retain_every_blocks=1, allow_partial_page_copy=False))
    rid = m.add_request(list(range(112)))
    m.allocate(rid, 112)
    m.commit(rid, 112)
    tables = m.tables(rid)
    assert sum(1 for p in tables["swa_r0_w32.swa_window"] if p) < sum(1 for p in tables["swa_r0_w64.swa_window"] if p)
    m.release(rid)
    hit = m.match(m.add_request(list(range(112)) + [7] * 8))
    assert hit.tokens == 112
    assert (len(hit.pages["swa_r0_w32.swa_window"]), len(hit.pages["swa_r0_w64.swa_window"]),
            len(hit.pages["full.compressed_kv"])) == (2, 4, 7)


def test_equal_windows_give_the_layout_from_hf_config():
    cfg = config([1, 0])
    assert Layout.from_layer_windows(cfg, [64, 0], name="x") == Layout.from_hf_config(cfg, name="x")


@pytest.mark.parametrize("windows", [[0, 32, 0], [0, 1, 0, 64], [32, 32, 0, 64], [0, "a", 0, 64], [0, True, 0, 64],
                                     [0, 32, 0, 1 << 25], [0, -4, 0, 64]])
def test_windows_that_contradict_the_config_are_refused(windows):
    with pytest.raises(ConfigError) as err:
        Layout.from_layer_windows(config([0, 1, 0, 1]), windows, name="x")
    assert err.value.key == "layer_windows"


def test_only_gpt_oss_configs_take_layer_windows():
    llama = {k: v for k, v in config([0, 0]).items() if k not in ("layer_types", "sliding_window")}
    with pytest.raises(ConfigError) as err:
        Layout.from_layer_windows(llama | {"model_type": "llama"}, [0, 0], name="x")
    assert err.value.key == "layer_windows" and "'llama'" in str(err.value)


def test_match_max_tokens_bounds_the_hit_and_says_so():
    from hkv_core.errors import InvalidRequestArgument

    layout = Layout.from_layer_windows(config([0, 1]), [0, 32], name="x")
    m = CacheManager(layout, ManagerConfig(pool_pages={p.name: 40 for p in layout.pools}, max_requests=4,
                                           max_request_tokens=512, retain_every_blocks=1,
                                           allow_partial_page_copy=False))
    rid = m.add_request(list(range(96)))
    m.allocate(rid, 96)
    m.commit(rid, 96)
    m.release(rid)
    rid = m.add_request(list(range(96)) + [1])
    assert m.match(rid).tokens == 96
    shorter = m.match(rid, max_tokens=96 - 16)
    assert shorter.tokens == 80 and "MAX_TOKENS" in shorter.codes
    assert len(shorter.pages["swa.swa_window"]) == 2  # the window before 80, not before 96
    assert m.match(rid, max_tokens=90).tokens == 80 and m.match(rid, max_tokens=0).tokens == 0
    m.acquire(rid, shorter)
    assert m.request_tokens(rid)[0] == 80
    other = m.add_request([1, 2, 3])
    for bad in (-1, 1.5, "8", True):
        with pytest.raises(InvalidRequestArgument):
            m.match(other, max_tokens=bad)
