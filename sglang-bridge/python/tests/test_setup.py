"""Start-up checks: KV buffers found and registered, uncovered memory refused naming the feature,
admission limits, trusted tenants."""

import pytest

from conftest import require_module
from fakes import MHAPool

torch = require_module("torch")


def _paged(kv, size=16, page_size=4, **settings):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    settings.setdefault("advertisedContextTokens", 16)
    return PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", kv, False, kvshield_settings=settings)


def test_describe_registers_every_layer_and_draft_pool():
    from kvshield_sglang import buffers

    target, draft = MHAPool(16, 4, layers=3), MHAPool(16, 4, layers=1)
    d = buffers.describe([target, draft], 16, 4)
    assert d["kinds"] == ["K", "V"] and d["layers"] == 4
    assert d["bytes_per_token"] == [16, 16]
    assert d["addresses"][:2] == [target.k_buffer[0].data_ptr(), target.v_buffer[0].data_ptr()]
    assert d["addresses"][-1] == draft.v_buffer[0].data_ptr()
    assert d["byte_sizes"][0] == 20 * 16 and d["device_index"] == -1


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

    with pytest.raises(ValueError, match="has 17 token rows; the allocator needs size \\+ page_size = 20"):
        buffers.describe([MHAPool(13, 4)], 16, 4)
    with pytest.raises(UnsupportedFeatureError, match="8 and 16 bytes per token"):
        buffers.describe([MHAPool(16, 4, head_dim=2), MHAPool(16, 4)], 16, 4)


def test_uncovered_memory_refused_naming_the_feature_unless_accepted(jvm):
    import types

    from kvshield_sglang.errors import UnsupportedFeatureError

    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool

    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    swa = SWAKVPool(size=16, size_swa=16, page_size=4, dtype=torch.float32, head_num=1, head_dim=4,
                    swa_attention_layer_ids=[0], full_attention_layer_ids=[1], device="cpu", enable_memory_saver=False)
    with pytest.raises(UnsupportedFeatureError, match=r"sliding-window \(SWA\) KV pools .*KVSHIELD_ACCEPT_GAPS=swa"):
        _paged(swa)

    args = types.SimpleNamespace(enable_hierarchical_cache=True)
    with pytest.raises(UnsupportedFeatureError, match="hierarchical host/storage KV cache tiers"):
        PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False, server_args=args,
                                    kvshield_settings={"advertisedContextTokens": 16})


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
    with pytest.raises(KvShieldError, match="rootKey must be file:PATH, fd:N or ephemeral: 'env:KEY'"):
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
