"""SGLang's allocator contract on tiny CPU pools (SGLang's own KV pool classes), for kvshield's classes
subclassing SGLang's own."""

import gc
import os
import random
import struct
import sys

import pytest

from conftest import require_module
from fakes import MHAPool, MLAPool, bridged_pool, ref_alloc_extend

torch = require_module("torch")

SETTINGS = {"level": "ZERO", "advertisedContextTokens": 64}


def _classes():
    from kvshield_sglang import allocator

    return allocator


@pytest.fixture
def flavor(jvm):
    """The allocator classes (they subclass SGLang's own)."""
    return "upstream"


def token_alloc(size=16, settings=None, kv=None):
    a = _classes()
    return a.TokenToKVPoolAllocator(size, torch.float32, "cpu", kv or MHAPool(size, 1), False,
                                    kvshield_settings=settings or SETTINGS)


def paged_alloc(size=32, page_size=4, settings=None, kv=None):
    a = _classes()
    return a.PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", kv or MHAPool(size, page_size), False,
                                         kvshield_settings=settings or SETTINGS)


def test_token_alloc_exact_slots_and_oom(flavor):
    a = token_alloc(16)
    assert a.available_size() == 16
    x = a.alloc(5)
    assert x.dtype == torch.int64 and x.device.type == "cpu"
    assert x.tolist() == [1, 2, 3, 4, 5]
    assert a.alloc(11).tolist() == list(range(6, 17))
    assert a.available_size() == 0
    assert a.alloc(1) is None
    assert a.alloc(0).numel() == 0


def test_token_free_then_reuse_in_freed_order(flavor):
    a = token_alloc(8)
    x = a.alloc(6)
    a.free(x[2:4])
    assert a.available_size() == 4  # queued for protection counts as available
    a.end_step()
    assert a.alloc(2).tolist() == [3, 4]
    assert a.available_size() == 2


def test_paged_alloc_whole_pages_slot0_reserved(flavor):
    a = paged_alloc(16, 4)
    assert a.available_size() == 16
    assert a.num_pages == 4
    x = a.alloc(8)
    assert x.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert a.alloc(12) is None
    y = a.alloc(8)
    assert y.tolist() == list(range(12, 20))
    assert all(s >= 4 for s in x.tolist() + y.tolist())  # page 0 (slots 0..3) never handed out
    assert a.alloc(4) is None
    with pytest.raises(Exception, match="multiple of page_size 4"):
        a.alloc(6)


def test_free_groups_batch_and_refuse_nesting(flavor):
    a = paged_alloc(16, 4)
    a.set_plan([("A", "t1", 0, 16)])
    x = a.alloc(16)
    a.clear_plan()
    a.free_group_begin()  # SGLang releases the requests that finished in a step inside one group
    with a.releasing("t1", "A"):
        a.free(x[:4])
        a.free(x[8:12])
    assert a.available_size() == 0  # held until the group ends
    assert a.page_owner(int(x[0]) // 4)[0] == "t1" and a.page_owner(int(x[8]) // 4)[0] == "t1"
    with pytest.raises(Exception, match="nested"):
        a.free_group_begin()
    a.free_group_end()
    assert a.available_size() == 8
    held = ("t1", a.request_id("A"))
    assert [a.page_owner(int(s) // 4) for s in x[::4]] == [(None, -1), held, (None, -1), held]
    a.end_step()
    assert a.alloc(8).tolist() == x[:4].tolist() + x[8:12].tolist()


def test_free_pages_len_clear_and_kvcache(flavor):
    kv = MHAPool(16, 4)
    a = paged_alloc(16, 4, kv=kv)
    assert a.get_kvcache() is kv
    a.alloc(8)
    assert len(a.free_pages) == 2
    a.clear()
    assert a.available_size() == 16
    assert a.alloc(16) is not None


def test_token_allocator_has_no_paged_calls(flavor):
    a = token_alloc(8)
    with pytest.raises(NotImplementedError):
        a.alloc_decode(torch.tensor([2]), torch.tensor([2]), torch.tensor([1]))


def test_mla_latent_buffers(flavor):
    a = paged_alloc(16, 4, kv=MLAPool(16, 4))
    assert a.alloc(4).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("page_size", [2, 4, 8])
def test_alloc_extend_and_decode_match_reference(flavor, page_size):
    rng = random.Random(20260 + page_size)
    size = 64 * page_size
    a = paged_alloc(size, page_size)
    next_page = 1  # a fresh pool without frees hands pages out in order
    reqs = []  # (seq_len, last slot) per live request
    for step in range(12):
        a.begin_step()
        if not reqs or rng.random() < 0.5:
            bs = rng.randint(1, 3)
            prefix = [0] * bs
            seq = [rng.randint(1, 3 * page_size) for _ in range(bs)]
            last = [-1] * bs
            ext = sum(seq)
            free_pages = list(range(next_page, next_page + 3 * bs + 3))
            expect, used = ref_alloc_extend(prefix, seq, last, free_pages, page_size)
            out = a.alloc_extend(torch.tensor(prefix), torch.tensor(prefix), torch.tensor(seq), torch.tensor(seq),
                                 torch.tensor(last), ext)
            assert out.tolist() == expect, f"step {step} seed {20260 + page_size}"
            next_page += used
            pos = 0
            for s in seq:
                pos += s
                reqs.append((s, out[pos - 1].item()))
        else:
            seq = [s + 1 for s, _ in reqs]
            last = [l for _, l in reqs]
            free_pages = list(range(next_page, next_page + len(reqs) + 1))
            expect, used = ref_alloc_extend([s - 1 for s in seq], seq, last, free_pages, page_size)
            out = a.alloc_decode(torch.tensor(seq), torch.tensor(seq), torch.tensor(last))
            assert out.tolist() == expect, f"step {step} seed {20260 + page_size}"
            next_page += used
            reqs = [(s, o) for s, o in zip(seq, out.tolist())]
        assert a.available_size() == (size // page_size - (next_page - 1)) * page_size


def test_alloc_extend_out_of_memory_is_none_and_changes_nothing(flavor):
    a = paged_alloc(8, 4)
    before = a.available_size()
    out = a.alloc_extend(torch.tensor([0]), torch.tensor([0]), torch.tensor([9]), torch.tensor([9]), torch.tensor([-1]), 9)
    assert out is None
    assert a.available_size() == before
    assert a.alloc(8).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_plan_attributes_pages_and_mismatch_goes_to_default_tenant(flavor):
    a = token_alloc(16)
    a.set_plan([("r1", "acme", 0, 2), ("r2", "globex", 3, 5)])
    assert a.alloc(4).tolist() == [1, 2, 3, 4]
    assert [a.page_owner(p)[0] for p in (1, 2, 3, 4)] == ["acme", "acme", "globex", "globex"]
    assert a.page_owner(3)[1] == a.request_id("r2")
    assert a.alloc(3).tolist() == [5, 6, 7]  # the plan covers 4 slots, not 3: unattributed
    assert a.page_owner(5) == ("default", -1)
    a.clear_plan()


def test_a_plan_that_raises_leaves_the_plan_unchanged_even_when_it_needs_more_room(flavor):
    a = token_alloc(16)
    a.set_plan([("r1", "acme", 0, 2)])
    rows = [(f"q{i}", "globex", 0, 1) for i in range(300)]  # more rows than the plan buffer holds
    with pytest.raises(ValueError):
        a.set_plan(rows + [("bad", "globex", "x", 1)])
    assert a.alloc(2).tolist() == [1, 2]
    assert [a.page_owner(p) for p in (1, 2)] == [("acme", a.request_id("r1"))] * 2
    with pytest.raises(struct.error):
        a.set_plan(rows + [("big", "globex", 0, 1 << 63)])  # outside int64: no plan, never a half-written one
    assert a.alloc(1).tolist() == [3]
    assert a.page_owner(3) == ("default", -1)


def _retract_and_resume(a, kv):
    """SGLang's retraction with CPU offload: a request's KV copied to host memory (``get_cpu_copy``), its pages
    freed; later new pages, the KV loaded back (``load_cpu_copy``). Returns (what the new pages hold, the host copy)."""
    a.set_plan([("r", "t1", 0, 8)])
    slots = a.alloc(8)
    a.clear_plan()
    for b in kv.buffers():
        b[slots] = torch.arange(8, dtype=torch.float32)[:, None, None] + 1.5
    expected = kv.read(slots).clone()
    host = a.get_cpu_copy(slots)
    with a.releasing("t1", "r"):
        a.free(slots)
    a.end_step()
    a.set_plan([("r", "t1", 0, 8)])
    again = a.alloc(8)
    a.clear_plan()
    a.load_cpu_copy(host, again)
    return kv.read(again), expected, host


def _host_bytes(host):
    return [t for layer in host for chunk in layer for t in chunk]


def test_retraction_cpu_copy_round_trips_and_leaves_no_bytes_in_host_memory(flavor):
    kv = MHAPool(32, 4)
    seen, expected, host = _retract_and_resume(paged_alloc(32, 4, kv=kv), kv)
    assert torch.equal(seen, expected), "the reloaded KV differs from what was offloaded"
    assert all(torch.count_nonzero(t).item() == 0 for t in _host_bytes(host)), "the host copy kept KV bytes"


def test_twin_keeping_the_host_copy_leaves_kv_bytes_in_host_memory(flavor, monkeypatch):
    from kvshield_sglang import allocator

    monkeypatch.setattr(allocator, "_zero_host_copy", lambda obj: None)
    kv = MHAPool(32, 4)
    _, _, host = _retract_and_resume(paged_alloc(32, 4, kv=kv), kv)
    assert any(torch.count_nonzero(t).item() for t in _host_bytes(host)), "the oracle above cannot fail"


def test_resize_rebuilds_an_empty_pool_and_refuses_one_holding_pages(flavor):
    import types

    from kvshield_sglang.errors import KvShieldError

    a = paged_alloc(32, 4)
    x = a.alloc(4)
    with pytest.raises(KvShieldError, match="while 1 page\\(s\\) are owned"):
        a.resize(types.SimpleNamespace(max_total_num_tokens=16))
    assert a.available_size() == 28 and a.size == 32
    a.free(x)
    a.end_step()
    a.resize(types.SimpleNamespace(max_total_num_tokens=16))
    assert a.size == 16 and a.num_pages == 4 and a.available_size() == 16
    assert a.alloc(16).tolist() == list(range(4, 20)) and a.alloc(4) is None


def _resize_without_restore(self, config):
    """Planted bug: the resize before its fix (the pool closed first, nothing reopened when the new one is refused)."""
    self.resolve_frees()
    self._jalloc.close()
    self.size = int(config.max_total_num_tokens)
    self.num_pages = self.size // self.page_size
    self._open(self._layout, self.size)
    self._bind()


@pytest.mark.parametrize("planted", [False, True])
def test_a_refused_resize_leaves_the_pool_as_it_was(flavor, monkeypatch, planted):
    """README: a resize that cannot be made "raises ... and stays as it was". Under strict admission the pool refuses
    to open at a size that cannot hold one max-length request (48 advertised tokens, 16 slots). The resize closed the
    old pool first: the refusal left the allocator with no pool and its size changed (64 -> 16), every later call
    failing (``'NoneType' object has no attribute 'availableTokens'``). Now the error names both numbers and the pool
    is the empty 64-token pool it was: tenant t1's released bytes are gone (scrubbed) and t2 gets every page, zeroed."""
    import types

    from kvshield_sglang.errors import KvShieldError

    if planted:
        monkeypatch.setattr(_classes()._KvShieldMixin, "resize", _resize_without_restore)
    kv = MHAPool(64, 4)
    a = paged_alloc(64, 4, kv=kv, settings=dict(SETTINGS, advertisedContextTokens=48, strictAdmission="true"))
    a.set_plan([("A", "t1", 0, 16)])
    s1 = a.alloc(16)
    a.clear_plan()
    for b in kv.buffers():
        b[s1] = 7.0
    with a.releasing("t1", "A"):
        a.free(s1)
    a.end_step()
    with pytest.raises(KvShieldError, match="advertised context 48 tokens, pool holds 16 tokens"):
        a.resize(types.SimpleNamespace(max_total_num_tokens=16))
    try:
        a.set_plan([("B", "t2", 0, 64)])
        s2 = a.alloc(64)
        a.clear_plan()
        got = None if s2 is None else kv.read(s2)
    except Exception as e:  # noqa: BLE001 (the planted bug: the allocator lost its pool)
        assert planted, f"the allocator fails after a refused resize: {type(e).__name__}: {e}"
        return
    assert not planted, "the planted bug went unseen"
    assert a.size == 64 and got is not None and got.shape[1] == 64, f"size {a.size}, t2 got {None if s2 is None else len(s2)}"
    assert torch.count_nonzero(got).item() == 0, f"t2 reads {torch.unique(got).tolist()} in its fresh pages"


def test_oversized_alloc_is_none_and_unaligned_segment_frees_its_page(flavor):
    a = paged_alloc(16, 4)
    assert a.alloc(64) is None and a.available_size() == 16
    x = a.alloc(8)
    a.free_segment(x[2:5], start_pos=2)  # positions 2..4: the pages of both, as SGLang's free_segment frees them
    assert a.rejected_frees() == 0
    a.end_step()
    assert a.available_size() == 16


def test_free_pages_are_page_id_tensors_with_released_pages_where_sglang_lists_them(flavor):
    paged, token = paged_alloc(16, 4), token_alloc(8)
    x = paged.alloc(8)
    paged.free(x[:4])
    assert paged.free_pages.tolist() == [1, 3, 4] and paged.release_pages.numel() == 0  # freed first
    y = token.alloc(3)
    token.free(y[:1])
    assert token.free_pages.tolist() == [4, 5, 6, 7, 8, 1]  # SGLang's token allocator appends freed slots


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
    a = bridged_pool(page_size)
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


@pytest.mark.parametrize("shape", ["list", "tuple"])
def test_a_retraction_cpu_copy_dropped_without_reload_is_zeroed(jvm, monkeypatch, shape):
    """SGLang's retraction offload (``Req.offload_kv_cache`` → ``get_cpu_copy``) copies a request's KV into host
    tensors; a reload (``load_cpu_copy``) zeroes them. A request aborted while retracted is never reloaded:
    SGLang drops the copy, and its host memory must not be freed holding the tenant's KV. Before its fix the
    dropped copy kept t1's bytes; later, the pools whose copy is a dict (DSA) or a tuple (HybridLinearKVPool,
    emulated here over the MHA pool with its wrapper's shape) were found still keeping them."""
    import gc

    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    pool = MHAPool(32, 4)
    if shape == "tuple":
        inner = pool.get_cpu_copy
        pool.get_cpu_copy = lambda indices, mamba_indices=None: (inner(indices), None)
    a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    a.set_plan([("A", "t1", 0, 4)])
    slots = a.alloc(4)
    a.clear_plan()
    for b in pool.buffers():
        b[slots] = 7.0

    def flat(o):
        if o is None:
            return []
        return [o] if torch.is_tensor(o) else [t for v in (o.values() if isinstance(o, dict) else o) for t in flat(v)]

    copy = a.get_cpu_copy(slots)
    host = [t.detach() for t in flat(copy)]  # aliases of the copy's memory, to read it back after SGLang drops it
    assert host and all(bool((t == 7.0).all()) for t in host)
    with a.releasing("t1", "A"):  # retraction releases the request's pages
        a.free(slots)
    a.end_step()
    del copy  # the request is aborted while retracted: SGLang drops its copy, never reloading it
    gc.collect()
    left = sum(int((t != 0).sum()) for t in host)
    assert left == 0, f"{left} KV values of t1 stay in the dropped retraction copy's host memory"


def _flat(o):
    import torch

    if torch.is_tensor(o):
        return [o]
    if o is None:
        return []
    if isinstance(o, dict):
        return [t for v in o.values() for t in _flat(v)]
    return [t for v in o for t in _flat(v)]


def test_a_dsa_retraction_copy_dropped_without_reload_is_zeroed(jvm, monkeypatch):
    """allocator.get_cpu_copy: "one SGLang drops without a reload (the request aborted while retracted) is zeroed
    when it is dropped, so its host memory is freed holding no KV". DSATokenToKVPool (a pool kvshield supports,
    buffers._dsa) returns its host copy as a dict {"kv": [...], "index_k": ...}, not a list; the finalizer is only
    attached to lists, so the dropped copy keeps the tenant's KV bytes in host memory."""
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    import coverage_world
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    pool = coverage_world.dsa()
    from sglang.srt.utils import current_platform
    monkeypatch.setattr(current_platform, "synchronize", lambda *a, **k: None)  # a CPU-only test host
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    a = PagedTokenToKVPoolAllocator(128, 64, torch.bfloat16, "cpu", pool, False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 128})
    a.set_plan([("A", "t1", 0, 64)])
    slots = a.alloc(64)
    a.clear_plan()
    for b in pool.kv_buffer:
        if b.numel():
            b[slots] = 7
    copy = a.get_cpu_copy(slots)
    host = [t.detach() for t in _flat(copy) if t.numel()]  # aliases of its memory: read back after SGLang drops it
    assert host and any(bool((t != 0).any()) for t in host), "the copy holds t1's KV"
    with a.releasing("t1", "A"):
        a.free(slots)
    a.end_step()
    del copy  # aborted while retracted: SGLang drops the copy without reloading it
    gc.collect()
    left = sum(int((t != 0).sum()) for t in host)
    assert left == 0, f"{left} KV values of t1 stay in the dropped DSA retraction copy's host memory"
