"""The tenant-scoped, sealed prefix cache on a bridged pool with CPU tensors: hits are counted and
paired with cross-tenant misses (a disabled or unscoped cache fails); under ENCRYPT an evicted prefix
comes back byte for byte, or answers "gone" once its page went to another tenant."""

import pytest

from conftest import TEST_SEALER, require_module
from fakes import FakeMHAPool

torch = require_module("torch")
SIZE, PAGE = 32, 4
TOKENS = list(range(1000, 1010))  # 2 full pages + a partial one


def _cache(level="ZERO", shared=None):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.prefix_cache import KvShieldPrefixCache

    kv = FakeMHAPool(SIZE, PAGE, layers=2)
    a = PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", kv, False, kvshield_settings={
        "level": level, "strict": True, "advertisedContextTokens": SIZE, "sealerFactory": TEST_SEALER})
    return a, kv, KvShieldPrefixCache(a, shared_tenant=shared)


def _read(kv, slots):
    return torch.stack([b[slots] for b in kv.k_buffer + kv.v_buffer])


def _finish(a, kv, cache, rid, tenant, value):
    """A request computes TOKENS' KV (value + position), finishes, and its full pages go to the cache."""
    a.set_plan([(rid, tenant, 0, len(TOKENS))])
    slots = a.alloc(12)[: len(TOKENS)]
    a.clear_plan()
    for b in kv.k_buffer + kv.v_buffer:
        b[slots] = (value + torch.arange(len(TOKENS), dtype=torch.float32))[:, None, None]
    assert cache.cache_finished_req(rid, tenant, TOKENS, slots) == 2
    with a.releasing(tenant):
        a.free(slots[8:])  # the partial tail page stays the request's to free
    return slots[:8], _read(kv, slots[:8]).clone()


class Unscoped:
    """Planted bug: every tenant looks up (and caches) in one scope."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def match_prefix(self, rid, tenant, token_ids):
        return self.real.match_prefix(rid, "t1", token_ids)


class Disabled:
    """Planted bug: the cache never hits."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def match_prefix(self, rid, tenant, token_ids):
        return torch.empty(0, dtype=torch.int64)


def _hit_and_cross_tenant_miss(wrap):
    a, kv, real = _cache()
    cache = wrap(real)
    cached_slots, cached_bytes = _finish(a, kv, real, "A", "t1", 10.0)
    hit = cache.match_prefix("B", "t1", TOKENS)
    assert torch.equal(hit, cached_slots), "same-tenant lookup must hit the cached pages"
    assert torch.equal(_read(kv, hit), cached_bytes)
    assert real.stats()["hits"] == 1
    miss = cache.match_prefix("C", "t2", TOKENS)
    assert miss.numel() == 0, "another tenant's lookup must miss"
    assert real.stats()["misses"] == 1


def test_same_tenant_hits_other_tenant_misses(jvm):
    _hit_and_cross_tenant_miss(lambda c: c)


@pytest.mark.parametrize("twin", [Unscoped, Disabled])
def test_twins_unscoped_or_disabled_cache_fail(jvm, twin):
    with pytest.raises(AssertionError, match="must"):
        _hit_and_cross_tenant_miss(twin)


def test_shared_namespace_is_opt_in(jvm):
    a, kv, cache = _cache(shared="public")
    public_slots, public_bytes = _finish(a, kv, cache, "sys", "public", 1.0)
    hit = cache.match_prefix("X", "t9", TOKENS)
    assert torch.equal(hit, public_slots) and torch.equal(_read(kv, hit), public_bytes)
    _, _, unshared = _cache()
    assert unshared.match_prefix("X", "t9", TOKENS).numel() == 0


def _evict_then_reclaim(level):
    a, kv, cache = _cache(level)
    cached_slots, cached_bytes = _finish(a, kv, cache, "A", "t1", 20.0)
    assert cache.evict(8) == 2
    a.end_step()
    assert not torch.equal(_read(kv, cached_slots), cached_bytes), "eviction must protect the pages"
    hit = cache.match_prefix("B", "t1", TOKENS)
    return a, kv, cache, hit, cached_bytes


def test_encrypt_evicted_prefix_is_reclaimed_byte_for_byte(jvm):
    a, kv, cache, hit, cached_bytes = _evict_then_reclaim("ENCRYPT")
    assert hit.numel() == 8
    assert torch.equal(_read(kv, hit), cached_bytes)
    assert cache.stats()["reclaim_hits"] == 2
    assert a.page_owner(int(hit[0]) // PAGE)[0] == "t1"


def test_twin_zero_loses_the_evicted_prefix(jvm):
    _, _, cache, hit, _ = _evict_then_reclaim("ZERO")
    assert hit.numel() == 0 and cache.stats()["reclaim_hits"] == 0


def test_reclaim_after_the_page_went_to_another_tenant_is_gone(jvm):
    a, kv, cache = _cache("ENCRYPT")
    cached_slots, _ = _finish(a, kv, cache, "A", "t1", 30.0)
    cache.evict(8)
    a.end_step()
    a.set_plan([("other", "t2", 0, SIZE)])  # takes every page, the sealed ones last
    taken = a.alloc(SIZE)
    a.clear_plan()
    assert set(cached_slots.tolist()) <= set(taken.tolist())
    assert torch.count_nonzero(_read(kv, cached_slots)).item() == 0, "sealed pages are zeroed at hand-out to another tenant"
    with a.releasing("t2"):
        a.free(taken)
    a.end_step()
    assert cache.match_prefix("B", "t1", TOKENS).numel() == 0
    assert cache.stats()["reclaim_gone"] >= 1
