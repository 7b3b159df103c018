"""Frees by leases: a free inside a request's release presents that request's holds, one outside any
release the engine's (tree cache while it evicts, unattributed pages). Double, stale, foreign, page-0
and bare frees of a request's slots are counted and dropped in production, raised (with the Java
message) in strict mode; the pool (owners, available pages, KV bytes) is unchanged either way. Frees
of device indices are deferred: the same rejections are found when they are resolved, and ``available_size()``
counts deferred frees, leftovers, free groups and unaligned segments at once, exactly. SGLang's stock
allocators, given the same calls, hand a live request's page out again (the twins)."""

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, MHAPool, bridged_pool, install_fake_cuda

torch = require_module("torch")

PATTERN_A, PATTERN_B, PATTERN_C = 1.5, 2.5, 3.5  # what each request's forward writes into its KV
SETTINGS = {"level": "ZERO", "advertisedContextTokens": 32}


def _pool(strict, page_size=4):
    return bridged_pool(page_size, 16 if page_size == 1 else 32, strict=strict)


def _write(a, slots, value):
    for buf in a.get_kvcache().buffers():
        buf[slots] = value


def _setup(strict):
    """Request A (tenant t1) holds pages 1-2 (sa), request B (tenant t2) page 3 (sb); each wrote its KV."""
    a = _pool(strict)
    a.set_plan([("A", "t1", 0, 8), ("B", "t2", 0, 4)])
    slots = a.alloc(12)
    a.clear_plan()
    sa, sb = slots[:8], slots[8:]
    _write(a, sa, PATTERN_A)
    _write(a, sb, PATTERN_B)
    return a, sa, sb


def _state(a):
    """Available slots, every page's (tenant, request) and the raw KV bytes of every slot."""
    return a.available_size(), [a.page_owner(p) for p in range(9)], a.get_kvcache().read(torch.arange(36)).tolist()


def _as(a, tenant, req, fn):
    with a.releasing(tenant, req):
        fn()


# Each names slots the freeing holder does not hold (run after A released sa[:4]).
BAD_FREES = {
    "double": lambda a, sa, sb: _as(a, "t1", "A", lambda: a.free(sa[:4])),
    "page0": lambda a, sa, sb: _as(a, "t1", "A", lambda: a.free(torch.tensor([0, 1, 2, 3]))),
    "never-allocated": lambda a, sa, sb: _as(a, "t1", "A", lambda: a.free(torch.tensor([28, 29]))),
    "foreign": lambda a, sa, sb: _as(a, "t2", "B", lambda: a.free(sa[4:8])),  # B releases A's slots
    "same-tenant": lambda a, sa, sb: _as(a, "t1", "A2", lambda: a.free(sa[4:8])),  # another request of A's tenant
    "bare": lambda a, sa, sb: a.free(sa[4:8]),  # no request context: an engine free of A's slots
}


@pytest.mark.parametrize("kind", sorted(BAD_FREES))
def test_production_counts_and_drops(jvm, kind):
    a, sa, sb = _setup(False)
    with a.releasing("t1", "A"):
        a.free(sa[:4])
    state = _state(a)
    BAD_FREES[kind](a, sa, sb)
    assert a.rejected_frees() == 1
    assert _state(a) == state
    a.end_step()  # a page released by mistake would be scrubbed and handed out from here
    assert _state(a)[1:] == state[1:]
    assert a.page_owner(int(sa[4]) // 4) == ("t1", a.request_id("A"))
    assert a.page_owner(int(sb[0]) // 4) == ("t2", a.request_id("B"))


def test_production_drops_only_the_bad_pages_of_a_batch(jvm):
    a, sa, sb = _setup(False)
    with a.releasing("t1", "A"):
        a.free(sa[:4])
    before = a.available_size()
    with a.releasing("t1", "A"):
        a.free(torch.cat([sa[:4], sb, sa[4:8]]))  # first page already freed, second B's, third still A's
    assert a.rejected_frees() == 2
    assert a.available_size() == before + 4
    assert a.page_owner(int(sa[4]) // 4) == (None, -1)
    assert a.page_owner(int(sb[0]) // 4) == ("t2", a.request_id("B"))
    assert torch.all(a.get_kvcache().read(sb) == PATTERN_B).item()


@pytest.mark.parametrize("tenant,req", [("t2", "B"), ("t1", "A2")], ids=["other-tenant", "same-tenant"])
def test_foreign_free_rejected_inside_request_release(jvm, tenant, req):
    a, sa, sb = _setup(False)
    state = _state(a)
    with a.releasing(tenant, req):
        a.free(sa)  # another request releases A's slots
    assert a.rejected_frees() == 2  # both of A's pages
    assert _state(a) == state
    a.end_step()
    assert _state(a) == state
    assert torch.all(a.get_kvcache().read(sa) == PATTERN_A).item()  # A's KV is intact
    with a.releasing("t1", "A"):
        a.free(sa)  # A still holds both pages: its own release frees them
    assert a.rejected_frees() == 2 and a.available_size() == state[0] + 8
    assert {a.page_owner(int(s) // 4) for s in sa} == {(None, -1)}


@pytest.mark.parametrize("stale", ["request", "bare"])
def test_stale_free_after_reuse_is_refused(jvm, stale):
    """A's slots, freed and reused by C (another tenant), freed again: by A's release (A holds nothing
    any more) or by the engine with no request context (C holds them). Refused; C keeps pages and KV."""
    a, sa, sb = _setup(False)
    with a.releasing("t1", "A"):
        a.free(sa)
    a.end_step()
    a.set_plan([("C", "t2", 0, 8)])
    sc = a.alloc(8)
    a.clear_plan()
    assert sorted(sc.tolist()) == sorted(sa.tolist())
    _write(a, sc, PATTERN_C)
    state = _state(a)
    if stale == "request":
        with a.releasing("t1", "A"):
            a.free(sa)  # A's stale slots now name C's pages
    else:
        a.free(sa)
    assert a.rejected_frees() == 2
    assert _state(a) == state
    a.end_step()
    assert _state(a) == state
    assert {a.page_owner(int(s) // 4) for s in sc} == {("t2", a.request_id("C"))}


def _stock_paged():
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", MHAPool(32, 4), False)


def _stock_token():
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    return TokenToKVPoolAllocator(16, torch.float32, "cpu", MHAPool(16, 1), False)


def _alloc(a, rows, n):
    """``alloc(n)`` under plan ``rows`` (kvshield attributes pages to requests; SGLang's stock allocators do not)."""
    if not hasattr(a, "set_plan"):
        return a.alloc(n)
    a.set_plan(rows)
    try:
        return a.alloc(n)
    finally:
        a.clear_plan()


def _step(a):
    if hasattr(a, "end_step"):
        a.end_step()


def _bare_free_of_a_live_request(a, where):
    """Request A writes its KV into 8 tokens, F holds the rest of the pool; then a free with no request
    context names A's slots (a stale engine free: nothing of A's was released); then request C asks
    for 8 tokens and writes its KV. Returns (A's slots, C's slots or None, what A's slots hold now)."""
    slots = _alloc(a, [("A", "t1", 0, 8), ("F", "t1", 0, 24)], 32)
    sa = slots[:8]
    _write(a, sa, PATTERN_A)
    if where == "device":
        a.free(DeviceOnlyTensor(sa.tolist()))
    else:
        a.free(sa)
    _step(a)
    sc = _alloc(a, [("C", "t2", 0, 8)], 8)
    if sc is not None:
        _write(a, sc, PATTERN_C)
    return sa.tolist(), None if sc is None else sc.tolist(), a.get_kvcache().read(sa)


def _live_request_kept_its_pages(sa, sc, seen):
    """The oracle: no slot of the live request A handed to C, and A's KV bytes as A wrote them."""
    return (sc is None or not set(sc) & set(sa)) and torch.all(seen == PATTERN_A).item()


@pytest.mark.parametrize("where", ["host", "device"])
def test_bare_free_of_a_live_requests_slots_is_refused(jvm, monkeypatch, where):
    install_fake_cuda(monkeypatch)
    a = _pool(False)
    sa, sc, seen = _bare_free_of_a_live_request(a, where)
    assert _live_request_kept_its_pages(sa, sc, seen)
    assert sc is None  # the pool is full: only A's pages could have served C
    assert a.rejected_frees() == 2 and a.pending_frees() == 0
    assert {a.page_owner(s // 4) for s in sa} == {("t1", a.request_id("A"))}
    with a.releasing("t1", "A"):
        a.free(torch.tensor(sa))  # A's own release still frees them: nothing was lost either
    a.end_step()
    a.set_plan([("C", "t2", 0, 8)])
    assert sorted(a.alloc(8).tolist()) == sorted(sa)
    assert a.rejected_frees() == 2


def test_twin_sglangs_stock_allocator_hands_the_live_requests_page_out_again(jvm):
    sa, sc, seen = _bare_free_of_a_live_request(_stock_paged(), "host")
    assert not _live_request_kept_its_pages(sa, sc, seen), "the oracle above cannot fail"
    assert sorted(sc) == sorted(sa) and torch.all(seen == PATTERN_C).item()  # C got A's pages and overwrote A's KV


def test_bare_free_of_the_tree_caches_pages_outside_its_eviction_is_refused(jvm):
    """After the tree cache took A's pages, only its eviction frees them; a stale engine free is refused."""
    a, sa, sb = _setup(False)
    a.cache_took("A", "t1")
    state = _state(a)
    a.free(sa)
    assert a.rejected_frees() == 2 and _state(a) == state
    with a.evicting():
        a.free(sa)
    assert a.rejected_frees() == 2 and a.available_size() == state[0] + 8
    assert {a.page_owner(int(s) // 4) for s in sa} == {(None, -1)}


def _double_free(a, slots_per_page, wrap, group=True, seen=lambda a, stage, page: None):
    """Request A holds the whole pool; its release frees its first page twice, inside one free group
    (``group``) or in one release without a group (``seen`` looks at the allocator after each free and
    after the group's end). Returns available slots (before, after both frees, after the group and a
    step boundary), every slot the pool then hands out, one page at a time, and the slots of the page
    freed twice."""
    size = a.size
    x = _alloc(a, [("A", "t1", 0, size)], size)
    first = x[:slots_per_page]
    page = int(first[0]) // slots_per_page
    before = a.available_size()
    if group:
        a.free_group_begin()
    if hasattr(a, "releasing"):
        with a.releasing("t1", "A"):
            a.free(wrap(first))
            seen(a, "first", page)
            a.free(wrap(first))
            seen(a, "second", page)
    else:
        a.free(first)
        a.free(first)
    during = a.available_size()
    if group:
        a.free_group_end()
        seen(a, "end", page)
    _step(a)
    after = a.available_size()
    handed = []
    for _ in range(size // slots_per_page):
        got = a.alloc(slots_per_page)
        if got is None:
            break
        handed += got.tolist()
    return before, during, after, handed, first.tolist()


def _released_once(before, after, handed, first):
    """The oracle: the page freed twice adds its slots once, and the pool hands each of them out once."""
    return after - before == len(first) and sorted(handed) == sorted(first)


def _wrap(where):
    return (lambda t: DeviceOnlyTensor(t.tolist())) if where == "device" else (lambda t: t)


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_page_freed_twice_in_one_free_group_is_refused_once_and_released_once(jvm, monkeypatch, page_size, where):
    install_fake_cuda(monkeypatch)
    a = _pool(False, page_size)
    log = []

    def seen(a, stage, page):
        log.append((stage, a.rejected_frees(), a.page_owner(page)))

    before, during, after, handed, first = _double_free(a, page_size, _wrap(where), True, seen)
    assert before == during == 0  # nothing available before the group ends
    assert _released_once(before, after, handed, first)
    assert a.rejected_frees() == 1 and a.pending_frees() == 0
    held = ("t1", -1)  # a deferred-free hold of A's tenant until the group ends
    if where == "host":  # the second free finds the group's hold, not A's own: refused at once
        assert log == [("first", 0, held), ("second", 1, held), ("end", 1, (None, -1))]
    else:  # deferred: found when resolved, in call order
        a_holds = ("t1", a.request_id("A"))
        assert log == [("first", 0, a_holds), ("second", 0, a_holds), ("end", 0, a_holds)]


@pytest.mark.parametrize("where", ["host", "device"])
@pytest.mark.parametrize("page_size", [1, 4])
def test_a_page_freed_twice_in_one_release_is_refused_once_and_released_once(jvm, monkeypatch, page_size, where):
    install_fake_cuda(monkeypatch)
    a = _pool(False, page_size)
    before, during, after, handed, first = _double_free(a, page_size, _wrap(where), False)
    assert _released_once(before, after, handed, first)
    assert a.rejected_frees() == 1 and a.pending_frees() == 0


@pytest.mark.parametrize("group", [True, False], ids=["group", "no-group"])
def test_twin_sglangs_stock_token_allocator_hands_a_slot_freed_twice_out_twice(jvm, group):
    before, during, after, handed, first = _double_free(_stock_token(), 1, lambda t: t, group)
    assert not _released_once(before, after, handed, first), "the oracle above cannot fail"
    assert handed == first * 2  # the same slot, to two allocations


def _strict_message(a, kind, sa, sb):
    """The Java message of the refused page: which page, which holder presented it, and why."""
    t1, req_a = a.tenant_id("t1"), a.request_id("A")
    return {"double": rf"free of page {int(sa[0]) // 4} by tenant {t1} request {req_a} refused: the page is"
                      rf" QUARANTINED",
            "page0": rf"free of page 0 by tenant {t1} request {req_a} refused: the page is RETIRED",
            "never-allocated": rf"free of page 7 by tenant {t1} request {req_a} refused: the page is FREE",
            "foreign": rf"free of page {int(sb[0]) // 4} by tenant {t1} request {req_a} refused: the page is OWNED by"
                       rf" tenant {a.tenant_id('t2')}"}[kind]


@pytest.mark.parametrize("kind", ["double", "page0", "never-allocated", "foreign"])
def test_strict_raises_java_message_and_changes_nothing(jvm, kind):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb = _setup(True)
    with a.releasing("t1", "A"):
        a.free(sa[:4])
    state = _state(a)
    bad = {"double": sa[:4], "page0": torch.tensor([0]), "never-allocated": torch.tensor([28]), "foreign": sb}[kind]
    with pytest.raises(KvShieldError) as e:
        with a.releasing("t1", "A"):
            a.free(torch.cat([sa[4:8], bad]))
    assert e.value.java_class == "dev.kvshield.tenant.ForeignAccessException"
    assert e.match(_strict_message(a, kind, sa, sb))
    assert a.rejected_frees() == 1
    assert _state(a) == state  # A's good page in the same batch was not released either


def test_strict_foreign(jvm):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb = _setup(True)
    state = _state(a)
    with pytest.raises(KvShieldError, match=rf"ForeignAccessException: free of page {int(sa[0]) // 4} by tenant"
                                            rf" {a.tenant_id('t2')} request {a.request_id('B')} refused: the page is"
                                            rf" OWNED by tenant {a.tenant_id('t1')}"):
        with a.releasing("t2", "B"):
            a.free(sa)  # B releases A's slots
    assert _state(a) == state


@pytest.mark.parametrize("strict", [True, False])
def test_token_allocator_duplicate_slot_is_refused_and_released_once(jvm, strict):
    from kvshield_sglang.errors import KvShieldError

    a = _pool(strict, page_size=1)
    a.set_plan([("A", "t1", 0, 4)])
    x = a.alloc(4).tolist()
    a.clear_plan()
    with a.releasing("t1", "A"):
        if strict:
            with pytest.raises(KvShieldError, match=rf"ForeignAccessException: free of page {x[0]} by tenant"):
                a.free(torch.tensor([x[0], x[0]]))
        else:
            a.free(torch.tensor([x[0], x[0]]))
    assert a.rejected_frees() == 1
    if strict:
        assert a.available_size() == 12 and a.page_owner(x[0]) == ("t1", a.request_id("A"))  # nothing released
        return
    assert a.available_size() == 13 and a.page_owner(x[0]) == (None, -1)  # released once
    a.end_step()
    handed = a.alloc(13).tolist()
    assert len(handed) == len(set(handed)) and x[0] in handed and a.alloc(1) is None


def test_bad_input_raises_clear_errors(jvm):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb = _setup(False)
    state = _state(a)
    with a.releasing("t1", "A"):
        with pytest.raises(KvShieldError, match="int64 or int32"):
            a.free(sa.to(torch.float32))
    # NOTE: a request's host free waits for its release's end (one crossing), so out-of-range slots raise there
    with pytest.raises(KvShieldError, match=r"IllegalArgumentException: free of slot 999 .*outside the pool"):
        with a.releasing("t1", "A"):
            a.free(torch.tensor([4, 999]))
    with pytest.raises(KvShieldError, match=r"IllegalArgumentException: free of slot -1"):
        with a.releasing("t1", "A"):
            a.free(torch.tensor([-1]))
    with pytest.raises(KvShieldError, match=r"IllegalArgumentException: free of slot 999 .*outside the pool"):
        a.free(torch.tensor([4, 999]))  # the same with no request context
    assert a.rejected_frees() == 0
    assert _state(a) == state  # nothing released by the rejected batches
    with a.releasing("t1", "A"):
        a.free(sa.to(torch.int32))  # SGLang frees req_to_token slices (int32)
    assert a.page_owner(1) == (None, -1) and a.page_owner(2) == (None, -1) and a.rejected_frees() == 0


def _device(t):
    return DeviceOnlyTensor(t.tolist() if isinstance(t, torch.Tensor) else t)


# Each frees slots the freeing holder does not hold; A's second page (sa[4:8]) is the one at risk.
DEFERRED_BAD = {
    "double": lambda a, sa, sb: _as(a, "t1", "A", lambda: a.free(_device(sa[:4]))),  # after A's free of the same page
    "page0": lambda a, sa, sb: _as(a, "t1", "A", lambda: a.free(_device([0, 1, 2, 3]))),
    "never-allocated": lambda a, sa, sb: _as(a, "t1", "A", lambda: a.free(_device([28, 29]))),
    "foreign": lambda a, sa, sb: _as(a, "t2", "B", lambda: a.free(_device(sa[4:8]))),
    "bare": lambda a, sa, sb: a.free(_device(sa[4:8])),
}


def _deferred_bad_then_good(strict, kind, monkeypatch):
    """A bad deferred free, then a good one behind it (B's release of its page); returns the allocator
    and the state the bad one must leave."""
    install_fake_cuda(monkeypatch)
    a, sa, sb = _setup(strict)
    with a.releasing("t1", "A"):
        a.free(sa[:4])  # host slots, no pending: released now
    state = _state(a)
    DEFERRED_BAD[kind](a, sa, sb)
    with a.releasing("t2", "B"):
        a.free(_device(sb))
    assert a.pending_frees() and a.rejected_frees() == 0 and _state(a)[1:] == state[1:]  # nothing reached the pool
    return a, sa, sb, state


def _bad_one_released_nothing_good_one_did(a, sa, sb, state):
    assert a.page_owner(int(sa[4]) // 4) == ("t1", a.request_id("A"))  # the bad free released nothing
    assert torch.all(a.get_kvcache().read(sa[4:8]) == PATTERN_A).item()
    assert a.page_owner(int(sb[0]) // 4) == (None, -1)  # the good one behind it was released
    assert a.available_size() == state[0] + 4


@pytest.mark.parametrize("kind", sorted(DEFERRED_BAD))
def test_production_finds_deferred_rejections_at_the_step_boundary(jvm, monkeypatch, kind):
    a, sa, sb, state = _deferred_bad_then_good(False, kind, monkeypatch)
    a.end_step()
    assert a.rejected_frees() == 1 and a.pending_frees() == 0
    _bad_one_released_nothing_good_one_did(a, sa, sb, state)


@pytest.mark.parametrize("kind", sorted(DEFERRED_BAD))
def test_strict_raises_deferred_rejections_at_resolution_with_the_java_message(jvm, monkeypatch, kind):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb, state = _deferred_bad_then_good(True, kind, monkeypatch)
    with pytest.raises(KvShieldError) as e:
        a.resolve_frees()
    assert e.value.java_class == "dev.kvshield.tenant.ForeignAccessException"
    page = {"double": int(sa[0]) // 4, "page0": 0, "never-allocated": 7}.get(kind, int(sa[4]) // 4)
    assert e.match(rf"free of page {page} by tenant .* refused: the page is")
    assert a.pending_frees() == 0 and a.rejected_frees() == 1
    _bad_one_released_nothing_good_one_did(a, sa, sb, state)


class _JumpsTheQueue:  # planted bug: a free reaches the pool ahead of the pending frees
    def free_segment(self, free_index, *, start_pos):
        pending, self._pending = self._pending, []
        try:
            super().free_segment(free_index, start_pos=start_pos)
        finally:
            self._pending = pending + self._pending


def _evict_twice_then_alloc(cls):
    """A full pool; the tree cache took A's pages; its eviction of them (deferred: device slots), then a
    second eviction of the same slots (host slots), then the engine allocates with no plan (unattributed
    pages: no request holds them, so only call order tells the second eviction from a free of them)."""
    a = cls(32, 4, torch.float32, "cpu", MHAPool(32, 4), False, kvshield_settings=dict(SETTINGS, strict=False))
    a.set_plan([("A", "t1", 0, 8), ("B", "t2", 0, 24)])
    sa = a.alloc(32)[:8]
    a.clear_plan()
    a.cache_took("A", "t1")
    with a.evicting():
        a.free(_device(sa))
        a.free_segment(sa.clone(), start_pos=0)
    sc = a.alloc(8).tolist()
    a.end_step()
    return a, sa.tolist(), sc


def test_frees_reach_the_pool_in_call_order_behind_a_deferred_one(jvm, monkeypatch):
    """A second free of pages an eviction already freed (deferred) is the double free, as without
    deferral; so no pending page is released by another path and handed out before its deferred free
    runs."""
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    install_fake_cuda(monkeypatch)
    a, sa, sc = _evict_twice_then_alloc(PagedTokenToKVPoolAllocator)
    assert set(sc) == set(sa)  # resolved for the allocation: the eviction released them, the second free was refused
    assert a.rejected_frees() == 2  # the second free, page by page
    assert {a.page_owner(s // 4) for s in sc} == {("default", -1)}


def test_twin_a_free_that_jumps_the_queue_frees_the_next_owners_pages(jvm, monkeypatch):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    install_fake_cuda(monkeypatch)
    a, sa, sc = _evict_twice_then_alloc(type("Planted", (_JumpsTheQueue, PagedTokenToKVPoolAllocator), {}))
    assert set(sc) == set(sa) and a.rejected_frees() == 0  # the new pages were A's; the eviction then freed them
    assert {a.page_owner(s // 4) for s in sc} == {(None, -1)}  # the live pages back in the pool


def test_out_of_range_slots_of_a_deferred_free_raise_at_resolution_and_release_nothing(jvm, monkeypatch):
    from kvshield_sglang.errors import KvShieldError

    install_fake_cuda(monkeypatch)
    a, sa, sb = _setup(False)
    with a.releasing("t1", "A"):
        a.free(_device([4, 999]))
    with a.releasing("t2", "B"):
        a.free(_device(sb))
    with pytest.raises(KvShieldError, match=r"IllegalArgumentException: free of slot 999 .*outside the pool"):
        a.end_step()
    assert a.page_owner(1) == ("t1", a.request_id("A"))  # the bad free released nothing
    assert a.page_owner(int(sb[0]) // 4) == (None, -1) and a.pending_frees() == 0  # the one behind it did
    a.set_plan([("C", "t2", 0, 4)])
    assert a.alloc(4).tolist() == sb.tolist()  # its page is back in the pool


def _release_outcome(monkeypatch, hold, body):
    """Runs ``body(a, sa, sb)`` inside A's release (with its leftovers) on a fresh pool, the request's host free
    held for the release's end (``hold``) or crossing at once; returns the pool's state, the refusals and the
    crossings the release made."""
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    if not hold:
        monkeypatch.setattr(PagedTokenToKVPoolAllocator, "_may_hold", property(lambda self: False))
    a, sa, sb = _setup(False)
    calls = []
    inner = a._call
    monkeypatch.setattr(a, "_call", lambda fn, *args: calls.append(fn) or inner(fn, *args))
    with a.releasing("t1", "A", leftovers=True):
        body(a, sa, sb)
    monkeypatch.undo()
    return _state(a), a.rejected_frees(), len(calls)


RELEASES = {
    # A frees its first page and B's page (refused), its second page is a leftover
    "own-and-foreign": lambda a, sa, sb: a.free(torch.cat((sa[:4], sb))),
    # the tree keeps A's second page after A freed all of it: that part of the free is withdrawn
    "free-then-kept": lambda a, sa, sb: (a.free(sa), a.tree_kept(sa[4:])),
    # two frees of one page in one release: the second is refused
    "twice": lambda a, sa, sb: (a.free(sa[:4]), a.free(sa[:4])),
}


@pytest.mark.parametrize("kind", sorted(RELEASES))
def test_a_release_whose_free_waits_for_its_end_ends_as_one_that_crossed_at_once(jvm, monkeypatch, kind):
    held = _release_outcome(monkeypatch, True, RELEASES[kind])
    at_once = _release_outcome(monkeypatch, False, RELEASES[kind])
    assert held[:2] == at_once[:2]
    if kind == "own-and-foreign":
        state, refused, crossings = held
        assert refused == 1 and crossings == 1 and at_once[2] == 3  # free, end of its frees, leftovers
        assert state[1][1] == (None, -1) and state[1][2] == (None, -1) and state[1][3][0] == "t2"  # B's page stays B's


def test_twin_a_release_that_ends_before_its_free_leaves_the_free_undone(jvm, monkeypatch):
    """Planted bug: the release's end ran without the held free (dropped): A's freed page stays owned."""
    from kvshield_sglang.allocator import _Releasing

    a, sa, sb = _setup(False)
    orig_exit = _Releasing.__exit__

    def dropping_exit(self, *exc):
        self._alloc._held = None
        return orig_exit(self, *exc)

    monkeypatch.setattr(_Releasing, "__exit__", dropping_exit)
    with a.releasing("t1", "A"):
        a.free(sa[:4])
    assert a.page_owner(int(sa[0]) // 4) == ("t1", a.request_id("A"))


def test_available_size_exact_after_free_group_mixing_host_and_device_frees(jvm, monkeypatch):
    """allocator.available_size docstring / README: deferred frees are counted at once, so SGLang's
    available_size() right after its free group equals what the pool holds once the frees reach it (and what
    SGLang's own allocator reports after the same calls). SGLang's result processing frees every finished
    request inside one free group; here request A's free is a host free (it crosses into the group now) and
    request B's a device free (deferred). After free_group_end, available_size() must count both."""
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator as StockPaged

    install_fake_cuda(monkeypatch)
    a = bridged_pool(4)
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
    a = bridged_pool(page_size)
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


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_stale_free_of_unattributed_slots_never_releases_a_planned_requests_page(jvm, page_size):
    """Design note 20's limit, bounded: pages allocated with no plan row share one unattributed holder, so their
    slots carry no owner a stale free could be checked against; once such a page went to a request (planned),
    a stale free of the old slots is refused, the pool is unchanged, the request keeps its bytes and no other
    tenant is handed its page. ``unattributed_pages()`` counts the unplanned allocation, not the planned one."""
    a = bridged_pool(page_size)
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
    reported_host, resolved_host = _release_with_leftovers(bridged_pool(page_size), device=False, group=group)
    assert reported_host == resolved_host == 2 * ps  # the host path counts the leftover page at the release's end
    reported, resolved = _release_with_leftovers(bridged_pool(page_size), device=True, group=group)
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
    a = bridged_pool(4)
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

    a = bridged_pool(4)
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_tree_kept_of_a_non_integer_tensor_raises_and_changes_nothing(jvm, dtype):
    """README ("Out-of-range slots and non-integer tensors always raise") and the brief's "bad input raises naming
    values and changes nothing": ``free``/``free_segment`` check the dtype, ``tree_kept`` (SGLang's insert hook,
    the other slot-taking entry point) does not. A float tensor's values are truncated to slots and the request's
    page silently becomes the tree cache's hold: after the release (with leftovers) the page is still held instead
    of going back to the pool."""
    from kvshield_sglang.errors import KvShieldError

    a = bridged_pool(4)
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
    host = bridged_pool(ps)
    assert _release_twice(host, device=False, nested=nested) == 3 * ps  # the host path: A's 3 pages, once
    assert host.rejected_frees() == 0

    a = bridged_pool(ps)
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
