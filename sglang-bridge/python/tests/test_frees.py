"""Frees without generations: double, stale, foreign and page-0 frees are counted and dropped in
production, raised (with the Java message) in strict mode; the pool is unchanged either way. Frees
of device indices are deferred: the same rejections are found when they are resolved."""

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, MHAPool, install_fake_cuda

torch = require_module("torch")


def _pool(strict, page_size=4):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    s = {"level": "ZERO", "strict": strict, "advertisedContextTokens": 32}
    if page_size == 1:
        return TokenToKVPoolAllocator(16, torch.float32, "cpu", MHAPool(16, 1), False, kvshield_settings=s)
    return PagedTokenToKVPoolAllocator(32, page_size, torch.float32, "cpu", MHAPool(32, page_size), False,
                                       kvshield_settings=s)


def _setup(strict):
    a = _pool(strict)
    a.set_plan([("A", "t1", 0, 8), ("B", "t2", 0, 4)])
    slots = a.alloc(12)
    a.clear_plan()
    return a, slots[:8], slots[8:]


def _state(a):
    return a.available_size(), [a.page_owner(p) for p in range(9)]


BAD_FREES = {
    "double": lambda a, sa, sb: (a.free(sa[:4]), a.free(sa[:4])),
    "page0": lambda a, sa, sb: a.free(torch.tensor([0, 1, 2, 3])),
    "never-allocated": lambda a, sa, sb: a.free(torch.tensor([28, 29])),
}


@pytest.mark.parametrize("kind", sorted(BAD_FREES))
def test_production_counts_and_drops(jvm, kind):
    a, sa, sb = _setup(False)
    BAD_FREES[kind](a, sa, sb)
    assert a.rejected_frees() == 1
    assert a.page_owner(int(sb[0]) // 4)[0] == "t2"


def test_production_drops_only_the_bad_pages_of_a_batch(jvm):
    a, sa, sb = _setup(False)
    a.free(sa[:4])
    before = a.available_size()
    a.free(torch.cat([sa[:4], sa[4:8]]))  # first page already freed, second still owned
    assert a.rejected_frees() == 1
    assert a.available_size() == before + 4


def test_foreign_free_rejected_inside_request_release(jvm):
    a, sa, sb = _setup(False)
    state = _state(a)
    with a.releasing("t1"):
        a.free(sb)  # tenant t1's request frees tenant t2's page
    assert a.rejected_frees() == 1
    assert _state(a) == state


def test_stale_free_after_reuse_is_foreign_to_the_old_tenant(jvm):
    a, sa, sb = _setup(False)
    with a.releasing("t1"):
        a.free(sa)
    a.end_step()
    a.set_plan([("C", "t2", 0, 8)])
    sc = a.alloc(8)
    a.clear_plan()
    assert sorted(sc.tolist()) == sorted(sa.tolist())
    state = _state(a)
    with a.releasing("t1"):
        a.free(sa)  # A's stale slots now name C's pages
    assert a.rejected_frees() == 2
    assert _state(a) == state


@pytest.mark.parametrize("kind,java", [("double", "DoubleFreeException"), ("page0", "StaleHandleException"),
                                       ("never-allocated", "StaleHandleException")])
def test_strict_raises_java_message_and_changes_nothing(jvm, kind, java):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb = _setup(True)
    if kind == "double":
        a.free(sa[:4])
    state = _state(a)
    with pytest.raises(KvShieldError) as e:
        a.free(torch.cat([sb, {"double": sa[:4], "page0": torch.tensor([0]),
                               "never-allocated": torch.tensor([28])}[kind]]))
    assert java in e.value.java_class
    assert "page=" in str(e.value)
    assert _state(a) == state  # sb was not released either


def test_strict_foreign(jvm):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb = _setup(True)
    with pytest.raises(KvShieldError, match="ForeignAccessException: page"):
        with a.releasing("t1"):
            a.free(sb)


def test_token_allocator_duplicate_slot_is_a_double_free(jvm):
    from kvshield_sglang.errors import KvShieldError

    a = _pool(True, page_size=1)
    x = a.alloc(4)
    with pytest.raises(KvShieldError, match="listed twice"):
        a.free(torch.tensor([x[0].item(), x[0].item()]))
    assert a.available_size() == 12


def test_bad_input_raises_clear_errors(jvm):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb = _setup(False)
    with pytest.raises(KvShieldError, match="int64 or int32"):
        a.free(sa.to(torch.float32))
    with pytest.raises(KvShieldError, match=r"IllegalArgumentException: free of slot 999 .*outside the pool"):
        a.free(torch.tensor([4, 999]))
    with pytest.raises(KvShieldError, match=r"IllegalArgumentException: free of slot -1"):
        a.free(torch.tensor([-1]))
    assert a.rejected_frees() == 0
    assert a.page_owner(1)[0] == "t1"  # nothing released by the rejected batches
    a.free(sa.to(torch.int32))  # SGLang frees req_to_token slices (int32)
    assert a.page_owner(1) == (None, -1)


def _device(t):
    return DeviceOnlyTensor(t.tolist() if isinstance(t, torch.Tensor) else t)


DEFERRED_BAD = {
    "double": lambda a, sa, sb: a.free(_device(sa[:4])),  # after an immediate free of the same page
    "page0": lambda a, sa, sb: a.free(_device([0, 1, 2, 3])),
    "never-allocated": lambda a, sa, sb: a.free(_device([28, 29])),
    "foreign": lambda a, sa, sb: _in_release(a, "t1", lambda: a.free(_device(sb))),
}
JAVA = {"double": "DoubleFreeException", "page0": "StaleHandleException", "never-allocated": "StaleHandleException",
        "foreign": "ForeignAccessException"}


def _in_release(a, tenant, fn):
    with a.releasing(tenant):
        fn()


def _deferred_bad_then_good(strict, kind, monkeypatch):
    """A bad deferred free, then a good one behind it; returns the allocator and the state the bad one must leave."""
    install_fake_cuda(monkeypatch)
    a, sa, sb = _setup(strict)
    a.free(sa[:4])  # host slots, no pending: released now
    state = _state(a)
    DEFERRED_BAD[kind](a, sa, sb)
    a.free(_device(sa[4:8]))
    assert a.pending_frees() == 2 and a.rejected_frees() == 0 and _state(a)[1] == state[1]  # nothing reached the pool
    return a, sa, sb, state


@pytest.mark.parametrize("kind", sorted(DEFERRED_BAD))
def test_production_finds_deferred_rejections_at_the_step_boundary(jvm, monkeypatch, kind):
    a, sa, sb, state = _deferred_bad_then_good(False, kind, monkeypatch)
    a.end_step()
    assert a.rejected_frees() == 1 and a.pending_frees() == 0
    assert a.page_owner(int(sb[0]) // 4)[0] == "t2"  # the bad free released nothing
    assert a.page_owner(int(sa[4]) // 4) == (None, -1)  # the good one behind it was released
    assert a.available_size() == state[0] + 4


@pytest.mark.parametrize("kind", sorted(DEFERRED_BAD))
def test_strict_raises_deferred_rejections_at_resolution_with_the_java_message(jvm, monkeypatch, kind):
    from kvshield_sglang.errors import KvShieldError

    a, sa, sb, state = _deferred_bad_then_good(True, kind, monkeypatch)
    with pytest.raises(KvShieldError) as e:
        a.resolve_frees()
    assert JAVA[kind] in e.value.java_class and "page" in str(e.value)
    assert a.pending_frees() == 0 and a.rejected_frees() == 1
    assert a.page_owner(int(sb[0]) // 4)[0] == "t2"
    assert a.page_owner(int(sa[4]) // 4) == (None, -1)
    assert a.available_size() == state[0] + 4


class _JumpsTheQueue:  # planted bug: a request's release reaches the pool ahead of the pending frees
    def free_segment(self, free_index, *, start_pos):
        pending, self._pending = self._pending, []
        try:
            super().free_segment(free_index, start_pos=start_pos)
        finally:
            self._pending = pending + self._pending


def _evict_then_release_then_alloc(cls):
    """A full pool; an eviction (deferred) of A's pages, then A's own release of them, then C allocates."""
    a = cls(32, 4, torch.float32, "cpu", MHAPool(32, 4), False,
            kvshield_settings={"level": "ZERO", "strict": False, "advertisedContextTokens": 32})
    a.set_plan([("A", "t1", 0, 8), ("B", "t2", 0, 24)])
    sa = a.alloc(32)[:8]
    a.clear_plan()
    a.free(_device(sa))
    with a.releasing("t1", "A"):
        a.free_segment(_device(sa), start_pos=0)
    a.set_plan([("C", "t2", 0, 8)])
    sc = a.alloc(8).tolist()
    a.clear_plan()
    a.end_step()
    return a, sa.tolist(), sc


def test_frees_reach_the_pool_in_call_order_behind_a_deferred_one(jvm, monkeypatch):
    """A request's own release of pages an eviction already freed (deferred) is the double free, as
    without deferral; so no pending page is released by another path and handed out before its
    deferred free runs."""
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    install_fake_cuda(monkeypatch)
    a, sa, sc = _evict_then_release_then_alloc(PagedTokenToKVPoolAllocator)
    assert set(sc) == set(sa)  # resolved for C: the eviction released them, then A's release was refused
    assert a.rejected_frees() == 2  # the request's release, page by page
    assert {a.page_owner(s // 4) for s in sc} == {("t2", a.request_id("C"))}


def test_twin_a_release_that_jumps_the_queue_frees_the_next_owners_pages(jvm, monkeypatch):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    install_fake_cuda(monkeypatch)
    a, sa, sc = _evict_then_release_then_alloc(type("Planted", (_JumpsTheQueue, PagedTokenToKVPoolAllocator), {}))
    assert set(sc) == set(sa) and a.rejected_frees() == 0  # C got A's pages; the eviction then freed them
    assert {a.page_owner(s // 4) for s in sc} == {(None, -1)}  # C's live pages back in the pool


def test_out_of_range_slots_of_a_deferred_free_raise_at_resolution_and_release_nothing(jvm, monkeypatch):
    from kvshield_sglang.errors import KvShieldError

    install_fake_cuda(monkeypatch)
    a, sa, sb = _setup(False)
    a.free(_device([4, 999]))
    a.free(_device(sb))
    with pytest.raises(KvShieldError, match=r"IllegalArgumentException: free of slot 999 .*outside the pool"):
        a.end_step()
    assert a.page_owner(1)[0] == "t1"  # the bad free released nothing
    assert a.page_owner(int(sb[0]) // 4) == (None, -1) and a.pending_frees() == 0  # the one behind it did
    a.set_plan([("C", "t2", 0, 4)])
    assert a.alloc(4).tolist() == sb.tolist()  # its page is back in the pool
