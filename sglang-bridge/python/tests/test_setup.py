"""Start-up checks: KV buffers found and registered, uncovered memory refused naming the feature,
admission limits, trusted tenants."""

import re
import types

import pytest

from conftest import require_module
from fakes import MHAPool

torch = require_module("torch")


def _paged(kv, size=16, page_size=4, **settings):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    settings.setdefault("advertisedContextTokens", 16)
    return PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", kv, False, kvshield_settings=settings)


def test_describe_registers_every_buffer_of_every_pool():
    from kvshield_sglang import buffers

    target, draft = MHAPool(16, 4, layers=3), MHAPool(16, 4, layers=1, head_dim=2)
    d = buffers.describe([target, draft], 16, 4)
    assert d["kinds"] == ["K"] * 3 + ["V"] * 3 + ["K", "V"]
    assert d["labels"][0] == "target:MHAPool.k_buffer[0]" and d["labels"][-1] == "draft1:MHAPool.v_buffer[0]"
    assert d["bytes_per_token"] == [16] * 6 + [8, 8]  # a draft of another shape keeps its own width
    assert d["addresses"][:2] == [target.k_buffer[0].data_ptr(), target.k_buffer[1].data_ptr()]
    assert d["addresses"][-1] == draft.v_buffer[0].data_ptr()
    assert d["byte_sizes"][0] == 20 * 16 and d["device_index"] == -1 and d["accepted_gaps"] == []


def test_draft_pool_pages_are_scrubbed_too(jvm):
    target, draft = MHAPool(16, 4), MHAPool(16, 4, layers=1)
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    a = PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", target, False, extra_kvcaches=[draft],
                                    kvshield_settings={"advertisedContextTokens": 16})
    x = a.alloc(4)
    draft.k_buffer[0][x] = 3.0
    a.free(x)
    assert torch.count_nonzero(draft.k_buffer[0]).item() == 0


def test_bad_buffers_refused():
    from kvshield_sglang import buffers
    from kvshield_sglang.errors import UnsupportedFeatureError

    with pytest.raises(ValueError, match="k_buffer\\[0\\] has 17 token rows; the allocator needs size \\+ page_size = 20"):
        buffers.describe([MHAPool(13, 4)], 16, 4)
    unknown = MHAPool(16, 4)
    unknown.k_cache_extra = torch.zeros(20, 4)  # a tensor no adapter knows
    with pytest.raises(UnsupportedFeatureError, match=r"target:MHAPool.k_cache_extra \(\(20, 4\)"):
        buffers.describe([unknown], 16, 4)


def test_uncovered_memory_refused_naming_the_feature_unless_accepted(jvm):
    import types

    from kvshield_sglang.errors import UnsupportedFeatureError

    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    swa = SWAKVPool(size=16, size_swa=16, page_size=4, dtype=torch.float32, head_num=1, head_dim=4,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu", enable_memory_saver=False)
    with pytest.raises(UnsupportedFeatureError, match=r"sliding-window \(SWA\) KV pools .*KVSHIELD_ACCEPT_GAPS=swa"):
        _paged(swa)
    # Accepted, the SWA pool is left to SGLang's SWA allocator: kvshield builds no allocator over it itself.
    with pytest.raises(UnsupportedFeatureError, match="no KV buffers to protect in SWAKVPool"):
        _paged(swa, accept_gaps="swa")

    args = types.SimpleNamespace(enable_hierarchical_cache=True)
    with pytest.raises(UnsupportedFeatureError, match="hierarchical host/storage KV cache tiers"):
        PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False, server_args=args,
                                    kvshield_settings={"advertisedContextTokens": 16})


@pytest.mark.parametrize("args,env,named", [
    ({"enable_flexkv": True}, {}, "server args --enable-flexkv (FlexKVRadixCache)"),
    ({"radix_cache_backend": "flexkv"}, {}, "server args --radix-cache-backend flexkv"),
    ({}, {"SGLANG_EXPERIMENTAL_CPP_RADIX_TREE": "1"}, "env SGLANG_EXPERIMENTAL_CPP_RADIX_TREE (RadixCacheCpp)"),
])
def test_a_tree_cache_whose_frees_kvshield_cannot_attribute_is_refused_at_start(jvm, monkeypatch, args, env, named):
    """Tree caches that free (evict, load back) and keep pages outside kvshield's hooks: never accepted."""
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator, UnsupportedFeatureError

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(UnsupportedFeatureError, match=re.escape(f"{named}: cannot be protected; refusing to start")):
        PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                    server_args=types.SimpleNamespace(**args),
                                    kvshield_settings={"advertisedContextTokens": 16, "accept_gaps": "all"})
    monkeypatch.delenv("SGLANG_EXPERIMENTAL_CPP_RADIX_TREE", raising=False)
    PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                server_args=types.SimpleNamespace(radix_cache_backend="kvshield"),
                                kvshield_settings={"advertisedContextTokens": 16}).close()


def test_unknown_setting_names_allowed_ones(jvm):
    from kvshield_sglang.errors import KvShieldError

    with pytest.raises(KvShieldError, match=r"unknown bridge setting 'lvl'; allowed: \[level, strict"):
        _paged(MHAPool(16, 4), lvl="ZERO")
    with pytest.raises(KvShieldError, match=r"level must be one of \[NONE, ZERO, ENCRYPT, COMPLIANCE\]: 'PARANOID'"):
        _paged(MHAPool(16, 4), level="PARANOID")
    with pytest.raises(KvShieldError, match=r"no page-memory backend \"rocm\"; found \[cpu-external, cpu-offheap, cuda\]"):
        _paged(MHAPool(16, 4), backend="rocm")
    with pytest.raises(KvShieldError, match=r"cuda wraps CUDA device memory, but host buffers \(device -1\) were given"):
        _paged(MHAPool(16, 4), backend="cuda")
    with pytest.raises(KvShieldError, match="ENCRYPT needs a key source"):
        _paged(MHAPool(16, 4), level="ENCRYPT")
    with pytest.raises(KvShieldError, match=r"rootKey must be file:PATH, fd:N or ephemeral: 'env:\.\.\.'"):
        _paged(MHAPool(16, 4), level="ENCRYPT", rootKey="env:KEY")



def test_admission_limits_follow_the_pool(jvm):
    a = _paged(MHAPool(16, 4), advertisedContextTokens=32)
    assert a.admission_limits() == (16, 32)
    from kvshield_sglang.errors import KvShieldError

    with pytest.raises(KvShieldError, match="PoolTooSmallException"):
        _paged(MHAPool(16, 4), advertisedContextTokens=32, strictAdmission=True)


def test_tenant_from_trusted_sources_only(tmp_path):
    import json

    from kvshield_sglang.tenants import TenantResolver

    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"sk-1": "acme"}))
    r = TenantResolver.from_env({"KVSHIELD_TENANT_HEADER": "X-KVShield-Tenant", "KVSHIELD_API_KEY_MAP": str(keys),
                                 "KVSHIELD_DEFAULT_TENANT": "anon"})
    assert r.resolve({"x-kvshield-tenant": "globex"}, "sk-1") == "globex"
    assert r.resolve({}, "sk-1") == "acme"
    assert r.resolve({}, "sk-unknown") == "anon"

    class Req:  # a client-controlled body field is never read
        tenant = "acme"
        kvshield_headers = None
        kvshield_api_key = None

    assert r.resolve_request(Req()) == "anon"
    with pytest.raises(ValueError, match="tenant name"):
        r.resolve({"X-KVShield-Tenant": "bad name\n"})


def test_sglang_input_limit_agrees_with_the_pool_and_is_exported(jvm, monkeypatch):
    import sys
    import types

    from kvshield_sglang import allocator

    gauges = {}

    class Gauge:  # stands in for prometheus_client.Gauge
        def __init__(self, name, doc, labels, multiprocess_mode):
            self.name = name

        def labels(self, kind):
            return types.SimpleNamespace(set=lambda v: gauges.__setitem__((self.name, kind), v))

    monkeypatch.setitem(sys.modules, "prometheus_client", types.SimpleNamespace(Gauge=Gauge))
    monkeypatch.setattr(allocator, "_ADMISSION_GAUGE", None)
    a = _paged(MHAPool(16, 4), advertisedContextTokens=4096)
    scheduler = types.SimpleNamespace(max_req_len=4095, max_req_input_len=4090)
    assert allocator.agree_input_limit(scheduler, a) == (16, 4096)
    assert (scheduler.max_req_len, scheduler.max_req_input_len) == (16, 11)
    assert gauges == {("kvshield_admission_limit_tokens", "effective"): 16,
                      ("kvshield_admission_limit_tokens", "advertised"): 4096}


def test_advertised_context_from_server_args(jvm, monkeypatch):
    import types

    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    monkeypatch.delenv("KVSHIELD_ADVERTISED_CONTEXT_TOKENS", raising=False)
    a = PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                    server_args=types.SimpleNamespace(context_length=8))
    assert a.admission_limits() == (8, 8)


def test_gap_names_are_checked_and_all_means_every_gap():
    from kvshield_sglang import buffers
    from kvshield_sglang.errors import UnsupportedFeatureError

    assert buffers.accepted_gaps({"accept_gaps": "swa, unknown-pool:VendorPool"}) == {"swa", "unknown-pool:VendorPool"}
    with pytest.raises(ValueError, match=r"unknown gap\(s\) \['hybrid'\] in KVSHIELD_ACCEPT_GAPS; known: .*'mamba'"):
        buffers.accepted_gaps({"accept_gaps": "hybrid"})
    refusals = [buffers.Refusal("swa", "pool A"), buffers.Refusal("unknown-tensor:P.x", "P.x")]
    assert buffers.settle(refusals, buffers.accepted_gaps({"accept_gaps": "all"})) == ["swa", "unknown-tensor:P.x"]
    with pytest.raises(UnsupportedFeatureError, match=r"P.x: a tensor kvshield does not know; refusing to start\."
                                                      r" To run with this memory unprotected, set"
                                                      r" KVSHIELD_ACCEPT_GAPS=unknown-tensor:P.x$"):
        buffers.settle(refusals, {"swa"})
    with pytest.raises(UnsupportedFeatureError, match=r"cannot be protected; refusing to start\.$"):  # never accepted
        buffers.settle([buffers.Refusal(None, "post-capture pool")], buffers.accepted_gaps({"accept_gaps": "all"}))


@pytest.mark.parametrize("page_size", [0])
def test_a_zero_page_size_is_refused_naming_it(jvm, page_size):
    """Fail closed with named values: a bad setting raises naming the value. A page size of 0 must be refused as
    a page size, naming it (as a negative one is: "pageSizeTokens must be in [1, 4096]: pageSizeTokens=-4", and
    as ``resize`` names "a positive multiple of page_size"). Observed: a bare ZeroDivisionError ("integer modulo
    by zero") from the allocator's own size check, naming nothing."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    with pytest.raises((ValueError, KeyError, TypeError, ArithmeticError, RuntimeError)) as e:
        PagedTokenToKVPoolAllocator(32, page_size, torch.float32, "cpu", MHAPool(32, 4), False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    msg = str(e.value)
    assert "page_size" in msg and str(page_size) in msg and not isinstance(e.value, ZeroDivisionError), (
        f"{type(e.value).__name__}: {msg}")
