"""Regressions found by attacking the bridge from outside: each test states a promise and failed while the code
broke it (a resize kept the closed pool's tenant ids; frees already in the pool's deferred list went uncounted
while their end waited behind deferred ones), or bounds a documented limit (unattributed holds). A second round: leftovers and unaligned segments counted
late, an eviction inside a free group that raised, a handoff between tenants, ``tree_kept`` of floats, the
prefix cache's ``reset``. A third: leftovers released twice counted twice."""

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, MHAPool, install_fake_cuda

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


def _release_with_leftovers(a, device, group=False):
    """Request A (tenant t1, two pages) is released with leftovers (as the release_kv_cache hook runs it); SGLang
    frees only its first page, the second is returned by the release's leftovers (README: "After a release, pages
    the request still holds ... are released"; the speculative-decoding limit: refused draft pages "stay the
    request's until its release returns them as leftovers"). The free is a device free (the GPU path) or a host
    free. Returns (available_size() change once the release ended, the change once the deferred operations
    reached the pool)."""
    ps = a.page_size
    a.set_plan([("A", "t1", 0, 2 * ps)])
    sa = a.alloc(2 * ps)
    a.clear_plan()
    before = a.available_size()
    if group:  # SGLang's result processing releases finished requests inside one free group
        a.free_group_begin()
    with a.releasing("t1", "A", leftovers=True):
        a.free(DeviceOnlyTensor(sa[:ps].tolist()) if device else sa[:ps])
    if group:
        a.free_group_end()
    reported = a.available_size() - before
    a.resolve_frees()  # nothing new is freed: the queued operations only reach the pool
    assert a.rejected_frees() == 0
    return reported, a.available_size() - before


@pytest.mark.parametrize("group", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
def test_available_size_counts_release_leftovers_behind_a_deferred_free(jvm, monkeypatch, page_size, group):
    """allocator.available_size docstring / design notes 21 and 26: once a release has ended, available_size()
    equals what it will be when the deferred operations reach the pool (it may only overstate when a free is
    rejected; none is here), and a release leaves the same availability whichever path its frees took. On the
    GPU path (the release's free is a device free, deferred) the release's leftovers (its second page) queue
    behind that free: available_size() must count them when the release ends, as it does on the host path."""
    install_fake_cuda(monkeypatch)
    ps = page_size
    reported_host, resolved_host = _release_with_leftovers(_pool(page_size), device=False, group=group)
    assert reported_host == resolved_host == 2 * ps  # the host path counts the leftover page at the release's end
    reported, resolved = _release_with_leftovers(_pool(page_size), device=True, group=group)
    assert resolved == 2 * ps
    assert reported == resolved, (f"available_size() after the release counted {reported} freed slots; the same"
                                  f" operations resolved give {resolved} (the leftover page of {ps} slots is missing"
                                  " until the next resolve; the host path counts it at once)")


@pytest.mark.parametrize("device", [False, True])
def test_tree_eviction_inside_a_free_group_frees_the_cache_page_at_group_end(jvm, monkeypatch, device):
    """allocator.free / free_group_begin / evicting docstrings and README: frees inside ``evicting()`` present the
    tree cache's holds, and inside SGLang's free group freed pages stay held until ``free_group_end`` releases them
    all. A tree eviction (of a page the tree kept at insert) that happens while a free group is open must therefore
    release the page at the group's end, as SGLang's own allocator does; instead the pool raises an internal
    IllegalArgumentException ("holder namespace 1 cannot hold a DEFERRED_FREE lease"), at the free (host slots) or
    at the next resolve (device slots: the step boundary), and the page stays the cache's for good although
    SGLang's tree no longer maps it."""
    install_fake_cuda(monkeypatch)
    a = _pool(4)
    a.set_plan([("A", "t1", 0, 8)])
    s = a.alloc(8)
    a.clear_plan()
    with a.releasing("t1", "A"):
        a.tree_kept(s)  # the tree's insert kept both pages
    a.end_step()
    page = int(s[0]) // 4
    assert a.page_owner(page) == ("t1", -1)  # the cache's hold
    before = a.available_size()
    errors = []
    a.free_group_begin()
    try:
        with a.evicting():
            a.free(DeviceOnlyTensor(s[:4].tolist()) if device else s[:4])
    except Exception as e:  # noqa: BLE001 (recorded: the promise is that nothing raises)
        errors.append(e)
    a.free_group_end()
    try:
        a.end_step()
    except Exception as e:  # noqa: BLE001
        errors.append(e)
    assert not errors, f"an eviction inside a free group raised: {errors[0]}"
    assert a.rejected_frees() == 0
    assert a.available_size() == before + 4, "the evicted page never returned to the pool"
    assert a.page_owner(page) == (None, -1)


@pytest.mark.parametrize("device", [False, True])
def test_available_size_counts_every_page_of_a_deferred_unaligned_free_segment(jvm, monkeypatch, device):
    """README / allocator.free_segment docstring: free_segment frees ``kv_row[start_pos : start_pos + n]``, an
    unaligned start freeing the page it falls in, as SGLang's does; available_size() counts a deferred free's pages
    at once, equal to what the pool holds once it resolves and to what SGLang's allocator reports. Request A's
    release frees row positions [2, 6) (4 slots over two pages) while an eviction's device free is pending, so the
    segment is deferred: available_size() must count both of its pages (SGLang: +8 slots), not ceil(4 / 4) = 1."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator as StockPaged

    install_fake_cuda(monkeypatch)
    stock = StockPaged(32, 4, torch.float32, "cpu", MHAPool(32, 4), False)
    t = stock.alloc(8)
    stock_before = stock.available_size()
    stock.free_segment(t[2:6], start_pos=2)
    assert stock.available_size() - stock_before == 8  # SGLang's own answer: both pages the positions touch

    a = _pool(4)
    a.set_plan([("A", "t1", 0, 8)])
    s = a.alloc(8)
    a.clear_plan()
    u = a.alloc(4)  # an unplanned page whose device free (outside any request) is pending first
    before = a.available_size()
    a.free(DeviceOnlyTensor(u.tolist()))
    with a.releasing("t1", "A"):
        seg = s[2:6]
        a.free_segment(DeviceOnlyTensor(seg.tolist()) if device else seg, start_pos=2)
    reported = a.available_size() - before
    a.resolve_frees()  # nothing new is freed: the pending operations only reach the pool
    assert a.rejected_frees() == 0
    resolved = a.available_size() - before
    assert resolved == 4 + 8
    assert reported == resolved, (f"available_size() counted {reported} freed slots; resolved: {resolved} (the"
                                  " unaligned segment's second page is missing until the next resolve)")


def test_a_handoff_never_commits_another_tenants_kv_into_a_reservation(jvm):
    """Top-level README: kvshield "makes leaks of one request's KV data into another's impossible by construction
    ... prefill->decode handoffs are verified page by page"; handoff.commit succeeds "only if coverage spans the
    sequence and every reserved page was written by this transfer". Prefill sends request r2 of tenant t2; decode
    reserved for request r1 of tenant t1 (the transport pairs them by bootstrap room: a reused, colliding or
    client-chosen room). Neither the reservation nor the commit compares the sender's tenant with the receiver's
    (the coverage row carries none), so t1's request commits and decodes over t2's KV bytes. Promised: the commit
    is refused (an abort), and t1 never reads t2's bytes."""
    from test_handoff import PEER, Pair

    from kvshield_sglang.errors import HandoffError

    p = Pair()
    p.prefill_request("r1", "t1", 8, 100.0)
    p.prefill_request("r2", "t2", 8, 500.0)
    dslots = p.decode.reserve("r1", "t1", 8, PEER)
    committed = False
    try:
        p.prefill.copy_to(p.decode, "r2", decode_rid="r1")  # the transport delivers t2's send to t1's reservation
        p.prefill.mark_sent("r2", 8)
        committed = p.decode.commit("r1", p.prefill.sent_tokens("r2"))
    except HandoffError:
        committed = False
    seen = p.dkv.read(dslots)
    reads_t2 = bool((seen >= 500.0).any().item())
    assert not (committed and reads_t2), (f"t1's request r1 committed (outcome {p.decode.outcome('r1')}) over tenant"
                                         f" t2's KV: {seen[0, :, 0, 0].tolist()}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tree_kept_of_a_non_integer_tensor_raises_and_changes_nothing(jvm, dtype):
    """README ("Out-of-range slots and non-integer tensors always raise") and the brief's "bad input raises naming
    values and changes nothing": ``free``/``free_segment`` check the dtype, ``tree_kept`` (SGLang's insert hook,
    the other slot-taking entry point) does not. A float tensor's values are truncated to slots and the request's
    page silently becomes the tree cache's hold: after the release (with leftovers) the page is still held instead
    of going back to the pool."""
    from kvshield_sglang.errors import KvShieldError

    a = _pool(4)
    a.set_plan([("A", "t1", 0, 8)])
    s = a.alloc(8)
    a.clear_plan()
    page = int(s[0]) // 4
    before = a.available_size()
    raised = None
    with a.releasing("t1", "A", leftovers=True):
        try:
            a.tree_kept(s[:4].to(dtype) + 0.7)  # not slot indices
        except (KvShieldError, TypeError, ValueError) as e:
            raised = e
    a.end_step()
    assert raised is not None, "tree_kept accepted a non-integer tensor"
    assert a.page_owner(page) == (None, -1), f"page {page} is held by {a.page_owner(page)} after A's release"
    assert a.available_size() == before + 8


def test_prefix_cache_reset_returns_the_cached_pages_scrubbed(jvm):
    """prefix_cache.reset docstring: "Drops every cached prefix; resident cache pages go back to the pool (SGLang's
    flush)"; SGLang's ``Scheduler.flush_cache`` (the /flush_cache endpoint, weight updates) calls
    ``tree_cache.reset()`` then ``token_to_kv_pool_allocator.clear()``. With any cached prefix, reset() raises
    AttributeError (it calls ``SlotAllocator.isOwned``, which does not exist), so SGLang's flush fails and the
    tenant's cached pages stay. Promised: reset() returns every cached page; after SGLang's flush the whole pool
    is available, a lookup misses, and another tenant allocating every page reads zeros (ZERO level)."""
    from prefix_driver import Engine, Req

    from kvshield_sglang.prefix_cache import KvShieldPrefixCache

    e = Engine(lambda params, shared: KvShieldPrefixCache(params, shared_tenant=shared))
    tokens = list(range(1000, 1010))
    full = e.alloc.available_size()
    kv = e.run(Req("A", "t1", tokens))
    assert torch.equal(kv, e.expected("t1", tokens))
    assert e.cache.total_size() == 8  # two whole pages cached for t1
    error = None
    try:
        e.cache.reset()  # SGLang's flush_cache, when the scheduler is idle
        e.alloc.clear()
    except Exception as ex:  # noqa: BLE001 (recorded: the promise is that the flush works)
        error = ex
    assert error is None, f"the prefix cache's reset() raised {type(error).__name__}: {error}"
    e.alloc.end_step()
    assert e.cache.total_size() == 0 and e.cache.evictable_size() == 0
    assert e.alloc.available_size() == full
    assert e.match(Req("B", "t1", tokens)).numel() == 0
    e.alloc.set_plan([("X", "t2", 0, full)])
    slots = e.alloc.alloc(full)
    e.alloc.clear_plan()
    assert slots is not None
    assert torch.count_nonzero(e.read(slots)).item() == 0, "t2 reads bytes t1 computed"


def _release_twice(a, device, nested):
    """Request A (3 pages) is released with leftovers around a free of its first page (a device free on the GPU
    path, deferred), and its leftovers are released once more: SGLang's release nested in another release of the
    same request, or ``release_leftovers`` called after the release (its docstring: "Releases every page request
    req still holds after SGLang's release of it"). Returns (available_size() now, the pages it will hold)."""
    ps = a.page_size
    a.set_plan([("A", "t1", 0, 3 * ps)])
    s = a.alloc(3 * ps)
    a.clear_plan()
    rest = a.available_size()
    a.set_plan([("B", "t2", 0, rest)])  # the rest of the pool is another tenant's
    assert a.alloc(rest) is not None and a.available_size() == 0
    a.clear_plan()
    first = DeviceOnlyTensor(s[:ps].tolist()) if device else s[:ps]
    if nested:
        with a.releasing("t1", "A", leftovers=True):
            with a.releasing("t1", "A", leftovers=True):
                a.free(first)
    else:
        with a.releasing("t1", "A", leftovers=True):
            a.free(first)
        a.release_leftovers("A", "t1")
    return a.available_size()


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("page_size", [1, 4])
def test_available_size_counts_a_requests_leftovers_once(jvm, monkeypatch, page_size, nested):
    """allocator.available_size docstring: deferred work is counted at once and "overstates only when a deferred
    free is rejected ... or its pages stay claimed"; design note 21: a release leaves the same availability
    whichever path its frees took; an allocation of what available_size() reported must succeed (SGLang admits
    work on it). Request A's leftovers are released twice (a nested release of A, or release_leftovers after
    A's release): the pool releases A's pages once (the second finds none, nothing is rejected). The host path
    reports A's 3 pages; on the GPU path (its free deferred) each leftovers call adds A's held pages again (less the
    freed one), so available_size() claims 5 pages free, alloc() of that returns None, and after the step 3 pages are free."""
    install_fake_cuda(monkeypatch)
    ps = page_size
    host = _pool(ps)
    assert _release_twice(host, device=False, nested=nested) == 3 * ps  # the host path: A's 3 pages, once
    assert host.rejected_frees() == 0

    a = _pool(ps)
    reported = _release_twice(a, device=True, nested=nested)
    got = a.alloc(reported)
    allocated = 0 if got is None else got.numel()
    a.resolve_frees()
    assert a.rejected_frees() == 0  # nothing was refused: no overstatement is allowed
    resolved = a.available_size() + allocated
    assert resolved == 3 * ps
    assert reported == resolved and got is not None, (
        f"available_size() reported {reported} free slots after A's release (host path: {3 * ps}); alloc({reported})"
        f" returned {got if got is None else got.numel()}; once resolved, {resolved} are free")
