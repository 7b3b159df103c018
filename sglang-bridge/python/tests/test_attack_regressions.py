"""Regressions found by attacking the bridge from outside: each test states a promise and failed while the code
broke it (a resize kept the closed pool's tenant ids; frees already in the pool's deferred list went uncounted
while their end waited behind deferred ones), or bounds a documented limit (unattributed holds)."""

import pytest

from conftest import require_module
from fakes import MHAPool

torch = require_module("torch")

SETTINGS = {"level": "ZERO", "advertisedContextTokens": 32}


def _pool(page_size=4, size=32, **kw):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    s = dict(SETTINGS, **kw)
    if page_size == 1:
        return TokenToKVPoolAllocator(size, torch.float32, "cpu", MHAPool(size, 1), False, kvshield_settings=s)
    return PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", MHAPool(size, page_size), False,
                                       kvshield_settings=s)


def _served_then_resized(a):
    """Tenant t1 served one request (alloc, write, release, step), then SGLang's resize rebuilds the empty pool."""
    a.set_plan([("A", "t1", 0, a.page_size)])
    sa = a.alloc(a.page_size)
    a.clear_plan()
    with a.releasing("t1", "A"):
        a.free(sa)
    a.end_step()
    a.resize(type("Config", (), {"max_total_num_tokens": a.size})())


@pytest.mark.parametrize("page_size", [1, 4])
def test_resize_keeps_tenants_apart(jvm, page_size):
    """README: resize rebuilds an empty pool over the same buffers; tenants stay tenants. After a resize, a
    tenant first seen afterwards (t3) and one seen before (t1) must not become one tenant of the new pool:
    each request's pages are owned by its own tenant, and each tenant's owned count is its own."""
    a = _pool(page_size)
    _served_then_resized(a)
    ps = a.page_size
    a.set_plan([("C", "t3", 0, ps)])
    sc = a.alloc(ps)
    a.clear_plan()
    a.set_plan([("B", "t1", 0, ps)])
    sb = a.alloc(ps)
    a.clear_plan()
    assert a.page_owner(int(sc[0]) // ps)[0] == "t3"
    assert a.page_owner(int(sb[0]) // ps)[0] == "t1", "t1's request's page is attributed to another tenant"
    assert a.tenant_owned_pages("t3") == 1 and a.tenant_owned_pages("t1") == 1
    assert a.tenant_id("t1") != a.tenant_id("t3")


def test_resize_then_prefix_cache_other_tenant_misses(jvm):
    """prefix_cache docstring: a lookup consults only the request's own tenant scope (never another tenant's).
    After a resize, t3 (first seen after it) must not hit t1's cached prefix and read t1's KV bytes."""
    from prefix_driver import Engine, Req

    from kvshield_sglang.prefix_cache import KvShieldPrefixCache
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    e = Engine(lambda params, shared: KvShieldPrefixCache(params, shared_tenant=shared))
    _served_then_resized(e.alloc)
    params = CacheInitParams(disable=False, req_to_token_pool=e.rows, token_to_kv_pool_allocator=e.alloc,
                             page_size=e.page)
    e.cache = KvShieldPrefixCache(params, shared_tenant=None)  # SGLang builds its tree cache after the resize
    tokens = list(range(1000, 1010))
    c = Req("C", "t3", [7, 7, 7, 7])
    e.run(c)  # t3's first request registers t3 in the new pool
    kv_b = e.run(Req("B", "t1", tokens))
    assert torch.equal(kv_b, e.expected("t1", tokens))
    d = Req("D", "t3", tokens)
    hit = e.match(d)
    reads_t1 = hit.numel() > 0 and torch.equal(e.read(hit), e.expected("t1", tokens)[:, :hit.numel()])
    assert not reads_t1, f"t3's lookup hit t1's cached pages {hit.tolist()} and reads t1's KV bytes"
    assert hit.numel() == 0


def test_available_size_exact_after_free_group_mixing_host_and_device_frees(jvm, monkeypatch):
    """allocator.available_size docstring / README: deferred frees are counted at once, so SGLang's
    available_size() right after its free group equals what the pool holds once the frees reach it (and what
    SGLang's own allocator reports after the same calls). SGLang's result processing frees every finished
    request inside one free group; here request A's free is a host free (it crosses into the group now) and
    request B's a device free (deferred). After free_group_end, available_size() must count both."""
    from fakes import DeviceOnlyTensor, install_fake_cuda
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator as StockPaged

    install_fake_cuda(monkeypatch)
    a = _pool(4)
    a.set_plan([("A", "t1", 0, 8), ("B", "t2", 0, 4)])
    s = a.alloc(12)
    a.clear_plan()
    sa, sb = s[:8], s[8:]
    before = a.available_size()
    a.free_group_begin()
    with a.releasing("t1", "A"):
        a.free(sa)
    with a.releasing("t2", "B"):
        a.free(DeviceOnlyTensor(sb.tolist()))
    a.free_group_end()
    reported = a.available_size() - before

    stock = StockPaged(32, 4, torch.float32, "cpu", MHAPool(32, 4), False)
    t = stock.alloc(12)
    stock_before = stock.available_size()
    stock.free_group_begin()
    stock.free(t[:8])
    stock.free(t[8:])
    stock.free_group_end()
    assert stock.available_size() - stock_before == 12  # SGLang's own answer for the same calls

    a.resolve_frees()  # nothing new is freed: the pending frees only reach the pool
    assert a.rejected_frees() == 0
    resolved = a.available_size() - before
    assert resolved == 12
    assert reported == resolved, (f"available_size() after free_group_end counted {reported} freed slots; the same"
                                  f" frees resolved give {resolved} (SGLang's allocator: 12)")


@pytest.mark.parametrize("page_size", [1, 4])
def test_available_size_exact_after_release_mixing_host_and_device_frees(jvm, monkeypatch, page_size):
    """The same promise for one request's release (no free group): a host free of half its pages, then a device
    free of the rest. Once the release has ended, available_size() must count all 8 freed slots (SGLang's own
    allocator does); it may not change when the pending frees merely reach the pool."""
    from fakes import DeviceOnlyTensor, install_fake_cuda

    install_fake_cuda(monkeypatch)
    a = _pool(page_size)
    a.set_plan([("A", "t1", 0, 8)])
    s = a.alloc(8)
    a.clear_plan()
    before = a.available_size()
    with a.releasing("t1", "A"):
        a.free(s[:4])
        a.free(DeviceOnlyTensor(s[4:].tolist()))
    reported = a.available_size() - before
    a.resolve_frees()
    assert a.rejected_frees() == 0
    resolved = a.available_size() - before
    assert resolved == 8
    assert reported == resolved, f"available_size() after the release counted {reported} of the {resolved} freed slots"


def _write(a, slots, value):
    for buf in a.get_kvcache().buffers():
        buf[slots] = value


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_stale_free_of_unattributed_slots_never_releases_a_planned_requests_page(jvm, page_size):
    """Design note 20's limit, bounded: pages allocated with no plan row share one unattributed holder, so their
    slots carry no owner a stale free could be checked against; once such a page went to a request (planned),
    a stale free of the old slots is refused, the pool is unchanged, the request keeps its bytes and no other
    tenant is handed its page. ``unattributed_pages()`` counts the unplanned allocation, not the planned one."""
    a = _pool(page_size)
    ps = a.page_size
    x = a.alloc(ps)
    assert a.unattributed_pages() == 1
    _write(a, x, 9.0)
    a.free(x)
    a.end_step()
    a.set_plan([("Y", "t1", 0, ps)])
    y = a.alloc(ps)
    a.clear_plan()
    assert y.tolist() == x.tolist()  # the page came back, now a request's
    assert a.unattributed_pages() == 1
    _write(a, y, 4.0)
    refused, before = a.rejected_frees(), a.available_size()
    a.free(x)  # stale: the unattributed holder freed these slots already
    assert a.rejected_frees() == refused + 1 and a.available_size() == before
    a.end_step()
    a.set_plan([("R", "t2", 0, ps)])
    r = a.alloc(ps)
    a.clear_plan()
    assert set(r.tolist()).isdisjoint(y.tolist())
    _write(a, r, 1.5)
    assert torch.all(a.get_kvcache().read(y) == 4.0).item(), "Y's request must read only its own bytes"
    assert a.page_owner(int(y[0]) // ps)[0] == "t1"
