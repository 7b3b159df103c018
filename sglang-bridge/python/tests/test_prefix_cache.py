"""The ``kvshield`` radix-cache backend (a subclass of SGLang's ``BasePrefixCache``) driven the way SGLang's
scheduler drives one (SGLang's ``Req`` and its match key, lock, extend, chunked ``cache_unfinished_req``,
``cache_finished_req``, evict) on tiny CPU pools. Every scenario asserts on KV bytes read back and has a
planted-bug twin (a cache subclass or wrapper in this file) that must fail it. Neither the backend nor the
allocator reads a device index on the host."""

from array import array
from types import SimpleNamespace

import pytest
from sglang.srt.mem_cache.base_prefix_cache import EvictParams

from conftest import TEST_SEALER, require_module

torch = require_module("torch")
P = list(range(1000, 1010))  # 2 full pages of 4 tokens + a partial one
Q = list(range(2000, 2010))


@pytest.fixture
def flavor(jvm):
    """The backend on SGLang's own base (no other exists)."""
    from sglang.srt.mem_cache.base_prefix_cache import BasePrefixCache

    from kvshield_sglang import prefix_cache

    assert issubclass(prefix_cache.KvShieldPrefixCache, BasePrefixCache)
    return "upstream"


def _real(params, shared):
    from kvshield_sglang.prefix_cache import KvShieldPrefixCache

    return KvShieldPrefixCache(params, shared_tenant=shared)


def _engine(factory=_real, level="ZERO", shared=None, size=64, page=4):
    from prefix_driver import Engine

    return Engine(factory, level=level, shared=shared, size=size, page=page,
                  sealer=TEST_SEALER if level == "ENCRYPT" else None)


def _no_host_reads(e):
    from prefix_driver import RowReads

    assert e.alloc.host_syncs() == 0, "the allocator copied a device index to the host"
    assert RowReads.reads == 0, "the cache read a req_to_token row on the host"


# ---------------------------------------------------------------- planted bugs (test code only)

def _subclass(body):
    from kvshield_sglang.prefix_cache import KvShieldPrefixCache

    cls = type("Planted", (KvShieldPrefixCache,), body)
    return lambda params, shared: cls(params, shared_tenant=shared)


def _ignores_scope(self, node, scope, namespace, block):
    return (namespace, block) if node is self.root_node else block  # one tree for every tenant


def _never_hits(self, params):
    params.req = None  # a lookup that names no request matches nothing
    return type(self).__mro__[1].match_prefix(self, params)


def _forgets_instead_of_sealing(self, params):
    from sglang.srt.mem_cache.base_prefix_cache import EvictResult

    dropped = [n for n in self._nodes() if n.value is not None and n.lock_ref == 0]
    for n in dropped:
        n.value = None  # the page leaves the tree, neither scrubbed nor sealed
    return EvictResult(num_tokens_evicted=len(dropped) * self.page_size)


def _trusts_sealed_page_ids(self, scope, namespace, token_ids, blocks):
    node = self.root_node
    for block in self._blocks(token_ids, blocks):
        node = node.children.get(self._child_key(node, scope, namespace, block))
        if node is None:
            break
        if node.value is None:  # the old page id, without reclaim or generation check
            self._make_resident(node, node.kvshield_sealed_ref & 0x7FFFFFFF)
    return type(self).__mro__[1]._walk(self, scope, namespace, token_ids, blocks)


def _ignores_locks(node, freed):
    return node.value is not None and node.kvshield_resident_children == freed


def _reads_rows(self, req, is_insert=True, **kwargs):
    self.req_to_token_pool.req_to_token[req.req_pool_idx].tolist()  # the stock cache's device->host copy
    return type(self).__mro__[1].cache_finished_req(self, req, is_insert, **kwargs)


def _moves_pages_ahead_of_deferred_frees(self, fn, *args):
    return fn(*args)  # no resolution first: pages move before the frees deferred ahead of them


UNSCOPED = {"_child_key": _ignores_scope}
DISABLED = {"match_prefix": _never_hits}
FORGETS = {"evict": _forgets_instead_of_sealing}
STALE = {"_walk": _trusts_sealed_page_ids}
IGNORES_LOCKS = {"_evictable": staticmethod(_ignores_locks)}
READS_ROWS = {"cache_finished_req": _reads_rows}
OUT_OF_ORDER = {"_call": _moves_pages_ahead_of_deferred_frees}


# ---------------------------------------------------------------- scenarios

def _hit_and_cross_tenant_miss(factory):
    from prefix_driver import Req

    e = _engine(factory)
    kv_a = e.run(Req("A", "t1", P), chunk=6)  # chunked prefill: cache_unfinished_req after 6 tokens
    assert torch.equal(kv_a, e.expected("t1", P))
    b = Req("B", "t1", P)
    e.admit(b)
    assert len(b.prefix_indices) > 8 and b.cache_protected_len == 8, "same-tenant lookup must hit the cached pages"
    hit = b.prefix_indices[:8]
    assert torch.equal(e.read(hit), e.expected("t1", P)[:, :8]), "a hit must read the cached bytes"
    assert e.alloc.page_owner(int(hit[0]) // e.page) == ("t1", -1), "cached pages belong to the tenant's cache namespace"
    assert e.cache.protected_size() == 8, "the matching request locks its pages"
    e.finish(b)
    assert e.cache.stats()["hits"] == 1
    c = Req("C", "t2", P)
    assert e.match(c).numel() == 0, "another tenant's lookup must miss"
    kv_c = e.run(c)
    assert torch.equal(kv_c, e.expected("t2", P)), "another tenant computes its own KV"
    assert e.cache.stats()["misses"] == 3
    assert e.cache.evictable_size() == 16 and e.cache.protected_size() == 0 and e.cache.total_size() == 16
    _no_host_reads(e)


def test_same_tenant_hits_other_tenant_misses(flavor):
    _hit_and_cross_tenant_miss(_real)


@pytest.mark.parametrize("twin", ["unscoped", "disabled", "reads_rows"])
def test_twins_unscoped_disabled_or_host_reading_cache_fail(flavor, twin):
    factory = {"unscoped": _subclass(UNSCOPED), "disabled": _subclass(DISABLED), "reads_rows": _subclass(READS_ROWS)}[twin]
    with pytest.raises(AssertionError, match="must|host"):
        _hit_and_cross_tenant_miss(factory)


def _shared_namespace(factory):
    from prefix_driver import Req

    e = _engine(factory, shared="public")
    e.run(Req("sys", "public", P))
    e.run(Req("own", "t1", Q))
    x = Req("X", "t9", P)
    e.admit(x)
    assert x.cache_protected_len == 8, "a declared shared prefix must hit for another tenant"
    assert torch.equal(e.read(x.prefix_indices[:8]), e.expected("public", P)[:, :8])
    e.finish(x)
    y = Req("Y", "t9", Q)
    assert e.match(y).numel() == 0, "an undeclared tenant's prefix must miss for another tenant"
    assert e.cache.protected_size() == 0
    _no_host_reads(e)
    plain = _engine(factory)
    plain.run(Req("sys", "public", P))
    assert plain.match(Req("Z", "t9", P)).numel() == 0, "without a declaration no tenant's prefix must hit for another"


def test_shared_namespace_hits_only_for_the_declared_tenant(flavor):
    _shared_namespace(_real)


def test_twin_unscoped_cache_shares_undeclared_prefixes(flavor):
    with pytest.raises(AssertionError, match="must"):
        _shared_namespace(_subclass(UNSCOPED))


def _evict_then_reclaim(factory, level="ENCRYPT"):
    from prefix_driver import Req

    e = _engine(factory, level=level)
    e.run(Req("A", "t1", P))
    cached = e.lookup(P, Req("probe", "t1", P))
    slots = cached.device_indices.clone()
    assert e.cache.evict(EvictParams(num_tokens=64)).num_tokens_evicted == 8
    e.alloc.end_step()
    assert not torch.equal(e.read(slots), e.expected("t1", P)[:, :8]), "eviction must protect the pages"
    b = Req("B", "t1", P)
    kv_b = e.run(b)
    assert b.cache_protected_len == 8, "the tenant's next hit must reclaim the evicted prefix"
    assert torch.equal(kv_b, e.expected("t1", P)), "a reclaimed prefix must read back byte for byte"
    assert e.cache.stats()["reclaim_hits"] == 2
    _no_host_reads(e)


def test_encrypt_evicted_prefix_is_reclaimed_byte_for_byte(flavor):
    _evict_then_reclaim(_real)


@pytest.mark.parametrize("twin", ["zero", "forgets"])
def test_twins_zero_or_unsealed_eviction_fail(flavor, twin):
    with pytest.raises(AssertionError, match="must"):
        if twin == "zero":
            _evict_then_reclaim(_real, level="ZERO")  # ZERO loses every evicted prefix
        else:
            _evict_then_reclaim(_subclass(FORGETS))


def _gone(factory):
    from prefix_driver import Req

    e = _engine(factory, level="ENCRYPT", size=32)
    e.run(Req("A", "t1", P))
    e.cache.evict(EvictParams(num_tokens=32))
    e.alloc.end_step()
    other = Req("other", "t2", list(range(5000, 5032)))
    e.admit(other)  # takes every page, the sealed ones last
    assert e.cache.total_size() == 0
    e.finish(other, is_insert=False)
    b = Req("B", "t1", P)
    assert e.match(b).numel() == 0, "a reclaim after the page went to another tenant must answer gone"
    kv_b = e.run(b)
    assert torch.equal(kv_b, e.expected("t1", P)), "the engine recomputes the prefix"
    assert e.cache.stats()["reclaim_gone"] >= 1
    _no_host_reads(e)


def test_reclaim_after_the_page_went_to_another_tenant_is_gone(flavor):
    _gone(_real)


def test_twin_stale_nodes_fail_the_gone_check(flavor):
    with pytest.raises(AssertionError, match="must"):
        _gone(_subclass(STALE))


def _locked_pages_stay(factory):
    from prefix_driver import Req

    e = _engine(factory, level="ENCRYPT")
    e.run(Req("A", "t1", P))
    b = Req("B", "t1", P)
    e.admit(b)
    hit = b.prefix_indices[:8].clone()
    assert e.cache.evict(EvictParams(num_tokens=64)).num_tokens_evicted == 0, "locked pages must stay"
    e.alloc.end_step()
    assert torch.equal(e.read(hit), e.expected("t1", P)[:, :8]), "locked pages must never be evicted"
    e.finish(b)
    assert e.cache.evict(EvictParams(num_tokens=64)).num_tokens_evicted == 8, "released pages must be evictable"
    _no_host_reads(e)


def test_locked_pages_are_never_evicted(flavor):
    _locked_pages_stay(_real)


def test_twin_eviction_ignoring_locks_fails(flavor):
    with pytest.raises(AssertionError, match="must"):
        _locked_pages_stay(_subclass(IGNORES_LOCKS))


def _deferred_double_free_then_reuse(factory, monkeypatch):
    """SGLang frees (device indices, so deferred) a page the cache holds; the cache then evicts it and
    a new request of the same tenant gets it. The double free must be refused, not free that request's page.
    Leases alone keep the page (a bare free never presents a request's holds), so the cache's part is the
    order: the pending free reaches the pool before the cache's crossing moves the page, and is refused
    there as the stale free of a cached page, never left pending until the page is a live request's."""
    from fakes import DeviceOnlyTensor, install_fake_cuda
    from kvshield_sglang.errors import KvShieldError
    from prefix_driver import Req

    install_fake_cuda(monkeypatch)
    e = _engine(factory, size=12)  # three pages: the new request needs the evicted ones
    e.run(Req("A", "t1", P))
    cached = e.match(Req("B", "t1", P))[:4].tolist()
    e.alloc.free(DeviceOnlyTensor(cached))
    assert e.alloc.pending_frees() == 1
    try:
        e.cache.evict(EvictParams(num_tokens=64))
    except KvShieldError:  # strict mode: the refused double free surfaces first; then the eviction runs
        e.cache.evict(EvictParams(num_tokens=64))
    assert e.alloc.pending_frees() == 0 and e.alloc.rejected_frees() == 1, \
        "the deferred double free must be refused before the cache moves its page, not left pending onto a live page"
    c = Req("C", "t1", Q)  # same step: SGLang allocates right after it evicts
    e.admit(c)
    e.alloc.end_step()
    rid = e.alloc.request_id(c)  # the pool's id of the Req object (as the cache and the plan name it)
    pages = [s // e.page for s in c.prefix_indices.tolist()[::e.page]]
    assert cached[0] // e.page in pages, "the evicted page must have gone to the new request (the scenario's premise)"
    assert all(e.alloc.page_owner(p) == ("t1", rid) for p in pages), "a deferred double free released a live page"
    assert e.alloc.rejected_frees() == 1


def test_deferred_frees_reach_the_pool_before_the_cache_moves_pages(flavor, monkeypatch):
    _deferred_double_free_then_reuse(_real, monkeypatch)


def test_twin_cache_moving_pages_ahead_of_deferred_frees_fails(flavor, monkeypatch):
    with pytest.raises(AssertionError, match="live page"):
        _deferred_double_free_then_reuse(_subclass(OUT_OF_ORDER), monkeypatch)


def test_a_lookup_naming_no_request_matches_nothing(flavor):
    from prefix_driver import Req

    e = _engine()
    e.run(Req("A", "t1", P))
    m = e.lookup(P)
    assert m.device_indices.numel() == 0 and m.last_device_node is e.cache.root_node


def _ignores_salt_match(self, params):
    params.key.cache_salt = None  # SGLang's cache_salt dropped from the lookup's namespace
    return type(self).__mro__[1].match_prefix(self, params)


def _ignores_salt_finish(self, req, is_insert=True, **kwargs):
    req.cache_salt = None  # ... and from the namespace the request's pages are cached under
    return type(self).__mro__[1].cache_finished_req(self, req, is_insert, **kwargs)


def _ignores_salt_unfinished(self, req, chunked=False, **kwargs):
    req.cache_salt = None
    return type(self).__mro__[1].cache_unfinished_req(self, req, chunked, **kwargs)


IGNORES_SALT = {"match_prefix": _ignores_salt_match, "cache_finished_req": _ignores_salt_finish,
                "cache_unfinished_req": _ignores_salt_unfinished}


def _namespaces_and_limit(factory):
    """SGLang's match key: a hit needs the tenant, the ``extra_key`` and the ``cache_salt``; its ``limit`` caps it."""
    from prefix_driver import Req

    e = _engine(factory)
    kv = e.run(Req("A", "t1", P, extra_key="ns", cache_salt="s1"), chunk=6)
    assert torch.equal(kv, e.expected("t1", P))
    hit = e.match(Req("B", "t1", P, extra_key="ns", cache_salt="s1"))
    assert hit.numel() == 8 and torch.equal(e.read(hit), e.expected("t1", P)[:, :8]), "same namespace must hit"
    for other in (Req("C", "t1", P, extra_key="ns", cache_salt="s2"), Req("D", "t1", P, extra_key="ns"),
                  Req("E", "t1", P, cache_salt="s1")):
        assert e.match(other).numel() == 0, f"{other.rid}: another extra_key or cache_salt must miss"
    capped = e.lookup(P, Req("F", "t1", P), extra_key="ns", cache_salt="s1", limit=5)
    assert capped.device_indices.numel() == 4, "a key's limit caps the match at its whole pages"


def test_extra_key_cache_salt_and_limit_scope_a_match(flavor):
    _namespaces_and_limit(_real)


def test_twin_cache_ignoring_cache_salt_fails(flavor):
    with pytest.raises(AssertionError, match="another extra_key or cache_salt must miss"):
        _namespaces_and_limit(_subclass(IGNORES_SALT))


def test_the_backend_is_registered_in_sglangs_registry(flavor):
    from sglang.srt.mem_cache import registry

    from kvshield_sglang import prefix_cache

    prefix_cache.register()
    prefix_cache.register()  # idempotent
    assert registry.get_radix_cache_factory("kvshield") is prefix_cache._factory


def _seeded_workload(factory, seed=7):
    """Seeded mix of tenants, shared prompts, chunk sizes and evictions under ENCRYPT: every request
    reads back exactly its tenant's KV, whatever mix of resident hits, reclaims and recomputes served it."""
    import random

    from prefix_driver import Req

    rng = random.Random(seed)
    e = _engine(factory, level="ENCRYPT", size=96)
    prompts = [[rng.randrange(1, 500) for _ in range(rng.randrange(5, 14))] for _ in range(5)]
    for i in range(40):
        tenant = rng.choice(["t1", "t2", "t3"])
        tokens = rng.choice(prompts) + [rng.randrange(1, 500) for _ in range(rng.randrange(0, 6))]
        kv = e.run(Req(f"w{i}", tenant, tokens), chunk=rng.choice([None, 3, 4, 7]))
        assert kv is not None and torch.equal(kv, e.expected(tenant, tokens)), \
            f"request {i} of {tenant} must read back its own KV (seed {seed})"
        assert e.cache.protected_size() == 0 and e.cache.evictable_size() == e.cache.total_size()
        if rng.random() < 0.3:
            e.cache.evict(EvictParams(num_tokens=rng.randrange(4, 40)))
            e.alloc.end_step()
    s = e.cache.stats()
    assert s["hits"] and s["reclaim_hits"], f"the workload must exercise resident hits and reclaims: {s}"
    _no_host_reads(e)


def test_seeded_workload_reads_back_each_tenants_own_kv(flavor):
    _seeded_workload(_real)


def test_twin_stale_nodes_fail_the_seeded_workload(flavor):
    from kvshield_sglang.errors import KvShieldError

    with pytest.raises((AssertionError, KvShieldError)):
        _seeded_workload(_subclass(STALE))


def test_dec_lock_ref_releases_the_lock_of_the_request_it_is_called_for(jvm, monkeypatch):
    """Two live requests B and C of one tenant hit the same cached prefix and each locks it. SGLang then
    releases B's matched-prefix lock alone (the decode side's ``_release_matched_prefix_lock`` when B's
    preallocation fails or B is aborted: ``dec_lock_ref(req.last_node)``, naming only the node); C keeps
    running. Found by attack: the backend released the latest lock, C's, so C lost its reader holds while
    it read, B's stayed forever, C's own release raised, and the prefix could never be evicted."""
    from kvshield_sglang.errors import KvShieldError
    from prefix_driver import Req

    e = _engine()
    e.run(Req("A", "t1", P))  # caches P's two full pages for t1
    b, c = Req("B", "t1", P), Req("C", "t1", P)
    e.admit(b)
    e.admit(c)
    node = b.last_node
    assert node is c.last_node and node is not e.cache.root_node
    hb, hc = e.cache._holder(b), e.cache._holder(c)
    assert node.kvshield_holders == [hb, hc]

    from sglang.srt.disaggregation.decode import DecodePreallocQueue
    from types import SimpleNamespace

    from kvshield_sglang import disagg

    release = DecodePreallocQueue._release_matched_prefix_lock
    monkeypatch.setattr(DecodePreallocQueue, "_release_matched_prefix_lock", disagg._wrap_release_prefix_lock(release))
    DecodePreallocQueue._release_matched_prefix_lock(SimpleNamespace(tree_cache=e.cache), b)  # SGLang's own, hooked
    e.rows.free(b)
    assert node.kvshield_holders == [hc], \
        f"dec_lock_ref for B released another request's lock: holders left {node.kvshield_holders}, B={hb} C={hc}"
    assert set(node.kvshield_readers) == {hc}, f"C (live) lost its reader hold: readers {node.kvshield_readers}"

    try:
        e.finish(c)
    except KvShieldError as err:
        pytest.fail(f"C's own release raised after B's lock was released: {err}")
    assert e.cache.evict(EvictParams(num_tokens=64)).num_tokens_evicted == 8, \
        "with every request done the cached prefix must be evictable (a stale lock pins it forever)"


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


def test_finish_with_committed_len_below_the_protected_prefix_releases_lock_and_pages(jvm, monkeypatch):
    """A retracted reasoning request re-prefilled in chunks, with ``--strip-thinking-cache``, wedges
    its pages and lock, and raises in the scheduler.

    Promise (sglang-bridge/README.md, "Prefix cache"; prefix_cache.py): ``cache_finished_req`` is the
    ``BasePrefixCache`` contract: a finished request's full pages go to its tenant's scope, duplicates and
    the unaligned tail go back, "and its lock is released". "Locks are readers ... until the paired
    dec_lock_ref (or its cache_finished_req)".

    What happens: SGLang's ``release_kv_cache`` calls ``cache_finished_req(req, kv_len_to_handle=
    req.effective_kv_committed_len())``. With ``strip_thinking_cache`` and ``reasoning_tokens > 0`` that is
    ``min(kv_committed_len, len(origin_input_ids))``. A retracted request re-prefills ``origin + output``
    (``get_fill_ids``). If it does that in chunks, ``cache_unfinished_req`` caches whole pages past the
    prompt, so ``cache_protected_len`` ends up larger than ``kv_len_to_handle``. ``cache_finished_req`` then
    computes ``from_page > full`` and passes ``settle(from=2, to=1, ...)`` to Java, which raises
    IllegalArgumentException. The KvShieldError reaches the scheduler's event loop, so the server goes
    down for every tenant. The request's lock is never released, so protected_size stays 8 and its pages
    stay pinned, and its own pages are never released. SGLang's stock RadixCache handles the same call
    without error (empty slices, then ``dec_lock_ref``).

    Severity: medium. It is a DoS: an availability and pool-leak problem reached by a normal request
    flow under a documented SGLang flag. It does not read across tenants.

    Cause: sglang-bridge/python/kvshield_sglang/prefix_cache.py: KvShieldPrefixCache.cache_finished_req
    (``from_page = cache_protected_len // ps`` is not clamped to ``full``/``end``; it calls ``_settle``
    before the unlock, with no ``finally``), and _settle (``path[from_page - 1]`` on a shorter path).
    """
    import sglang.srt.managers.schedule_batch as sb

    from prefix_driver import Req

    monkeypatch.setattr(sb, "get_serving", lambda: SimpleNamespace(strip_thinking_cache=True))
    e = _engine()
    r = Req("R", "t1", P[:5])
    r.output_ids = array("q", P[5:10])  # retracted after 5 reasoning tokens: it re-prefills input + output
    r.reasoning_tokens = 5
    e.admit(r, chunk=8)                  # chunked re-prefill: first chunk of 8 tokens
    e.chunk_done(r, 8)                   # cache_unfinished_req caches 2 whole pages (past the 5-token prompt)
    assert r.cache_protected_len == 8
    e.extend(r, 10)
    r.kv_committed_len = 10
    committed = r.effective_kv_committed_len()
    assert committed == 5, "SGLang's strip_thinking_cache commit length"
    _finish(e, r, committed)
    assert e.cache.evictable_size() == e.cache.total_size()


def test_finish_below_protected_prefix_without_chunking_multi_turn(jvm, monkeypatch):
    """A variant of the retracted reasoning request above (same cause): no chunking needed. The tenant's own cache
    already holds the retracted request's prompt plus answer, e.g. a later chat turn whose prompt is this turn's
    prompt and answer. The re-admitted request matches 8 tokens, ``effective_kv_committed_len()`` is 5, and
    ``cache_finished_req`` raises before it unlocks.
    Severity: medium (DoS, pinned pages). Cause: prefix_cache.py: KvShieldPrefixCache.cache_finished_req."""
    e, r = _retracted_below_its_cached_answer(monkeypatch)
    assert r.cache_protected_len == 8
    _finish(e, r, r.effective_kv_committed_len())


def _retracted_below_its_cached_answer(monkeypatch):
    """Under ``strip_thinking_cache``: the tenant's cache holds prompt and answer (a later turn's prompt); the retracted
    reasoning request (5 prompt tokens, 5 output) is re-admitted matching 8 tokens, 10 committed."""
    import sglang.srt.managers.schedule_batch as sb

    from prefix_driver import Req

    monkeypatch.setattr(sb, "get_serving", lambda: SimpleNamespace(strip_thinking_cache=True))
    e = _engine()
    e.run(Req("turn2", "t1", P))
    r = Req("R", "t1", P[:5])
    r.output_ids = array("q", P[5:10])
    r.reasoning_tokens = 5
    e.admit(r)
    r.kv_committed_len = 10
    return e, r


def _finish(e, r, committed):
    """SGLang's release of ``r`` as the plug-in runs it (its leftovers, the pages past what it commits, go back with
    the release): its lock is released and only the two cached pages stay owned."""
    with e.alloc.releasing("t1", r, leftovers=True):
        e.cache.cache_finished_req(r, is_insert=True, kv_len_to_handle=committed)
    e.rows.free(r)
    e.alloc.end_step()
    assert e.cache.protected_size() == 0, "the finished request's lock must be released"
    assert e.alloc._pages_in(1 << 2).numel() == 2, "only the 2 cached pages may stay owned"


def test_twin_settling_from_the_protected_page_raises_and_keeps_the_lock(jvm, monkeypatch):
    """Planted bug: ``cache_finished_req`` settles from the protected page whatever the committed length (as before the
    fix): the finish raises in the scheduler loop."""
    from kvshield_sglang import prefix_cache
    from kvshield_sglang.errors import KvShieldError

    e, r = _retracted_below_its_cached_answer(monkeypatch)
    monkeypatch.setattr(prefix_cache, "_pages_to_settle", lambda protected, committed, cached, ps: (
        protected // ps, cached // ps, -(-committed // ps)))
    with pytest.raises(KvShieldError):
        _finish(e, r, r.effective_kv_committed_len())


# ---------------------------------------------------------------- sealed nodes and eviction stay bounded by the pool


def _sealed_nodes_bounded(factory, monkeypatch, page):
    """Under ``ENCRYPT`` a tenant sending unique prompts seals page after page. A page the cache takes again ends
    the sealed reference an older eviction left on it, so the tree keeps at most one node per pool page (resident
    and sealed nodes name distinct pages), eviction pops its queue without walking the tree, and a sealed prefix
    still comes back byte for byte."""
    from prefix_driver import Req

    e = _engine(factory, level="ENCRYPT", size=32, page=page)
    pages = int(e.alloc._j.pageCount())
    prompts = [list(range(10000 + 8 * i, 10008 + 8 * i)) for i in range(60)]
    for i, tokens in enumerate(prompts):
        if i == 30:  # from here on an eviction that walks the tree raises
            monkeypatch.setattr(e.cache, "_nodes", lambda: pytest.fail("eviction walked the whole tree"))
        assert e.run(Req(f"r{i}", ("acme", "globex")[i % 2], tokens)) is not None
    nodes = list(e.cache._subtree(e.cache.root_node))[1:]
    sealed = [n.kvshield_page for n in nodes if n.value is None]
    resident = [n.kvshield_page for n in nodes if n.value is not None]
    assert len(nodes) <= pages, f"{len(nodes)} nodes over a pool of {pages} pages"
    assert e.cache.stats()["sealed_pages"] == len(sealed) and e.cache.stats()["resident_pages"] == len(resident)
    assert len(set(sealed + resident)) == len(nodes), f"two nodes name one page: sealed {sealed}, resident {resident}"
    e.cache.evict(EvictParams(num_tokens=64))  # everything sealed; nothing allocated until the lookup below
    e.alloc.end_step()
    last, reclaimed = Req("again", "globex", prompts[-1]), e.cache.stats()["reclaim_hits"]
    assert torch.equal(e.run(last), e.expected("globex", prompts[-1])), "the latest sealed prefix must come back"
    assert last.matched_tokens > 0 and e.cache.stats()["reclaim_hits"] > reclaimed, "it came back by reclaim"


class _NoPageIndex(dict):
    def get(self, page, default=None):
        return default  # a page taken again never finds the sealed node naming it


def _keeps_stale_sealed_nodes(self):
    type(self).__mro__[1].reset(self)
    self._sealed = _NoPageIndex()


@pytest.mark.parametrize("page", [1, 4])
def test_encrypt_eviction_keeps_at_most_one_node_per_pool_page(jvm, monkeypatch, page):
    _sealed_nodes_bounded(_real, monkeypatch, page)


def test_twin_keeping_sealed_nodes_of_pages_taken_again_outgrows_the_pool(jvm, monkeypatch):
    with pytest.raises(AssertionError, match="over a pool of"):
        _sealed_nodes_bounded(_subclass({"reset": _keeps_stale_sealed_nodes}), monkeypatch, 4)


# ---------------------------------------------------------------- a release survives what the engine gets wrong


def _stale_free_setup(monkeypatch):
    """Request ``old`` (one page of acme) finishes and is evicted; ``new`` (two full pages and a partial one) gets its
    page again. Returns the engine, ``new`` and ``old``'s stale slots."""
    from fakes import install_fake_cuda
    from prefix_driver import Req

    install_fake_cuda(monkeypatch)
    e = _engine(size=16)  # four pages: the next request gets the first one's page again
    old = Req("old", "acme", list(range(1000, 1004)))
    e.admit(old)
    stale = e.rows.req_to_token[old.req_pool_idx, :4].long().as_subclass(torch.Tensor).clone()
    e.finish(old)
    e.cache.evict(EvictParams(num_tokens=64))
    e.alloc.end_step()
    new = Req("new", "acme", list(range(2000, 2010)))
    e.admit(new)
    return e, new, stale


def _empty_pool(e, new):
    """What ``new``'s release left: its pool holds, and the pool's free tokens once the cache is evicted."""
    held = int(e.alloc._j.heldPages(e.alloc.request_id(new)))
    e.rows.free(new)
    e.alloc.end_step()
    e.cache.evict(EvictParams(num_tokens=64))
    e.alloc.end_step()
    return held, e.alloc.available_size()


def test_a_stale_free_inside_a_release_caches_the_pages_before_it_and_leaks_nothing(jvm, monkeypatch):
    """Inside ``new``'s release SGLang frees ``old``'s slots, which the pool has since given to ``new`` (a stale free,
    as ``scheduler_world.StaleFree('release')`` injects it): the free of ``new``'s own page stands, the cache takes
    ``new``'s pages up to that position only, the release raises nothing and every other page goes with it."""
    from fakes import DeviceOnlyTensor

    e, new, stale = _stale_free_setup(monkeypatch)
    mine = e.rows.req_to_token[new.req_pool_idx, :10].long().as_subclass(torch.Tensor).tolist()
    gap = mine[::4].index(stale[0].item())  # the page position the stale free empties
    with e.alloc.releasing("acme", new, leftovers=True):  # the plug-in's release_kv_cache context
        e.alloc.free(DeviceOnlyTensor(stale.tolist()))
        e.cache.cache_finished_req(new, kv_len_to_handle=10)
    cached = [n for n in e.cache._nodes()]
    assert [n.kvshield_page for n in cached] == [s // 4 for s in mine[:4 * gap:4]], "only the pages before the gap"
    assert all(e.alloc.page_owner(n.kvshield_page)[0] == "acme" for n in cached)
    assert _empty_pool(e, new) == (0, 16)


def _failing_settle(e):
    """The cache's Java bridge with a ``settle`` that raises, as any refused tree call does."""
    from kvshield_sglang.errors import KvShieldError

    bridge = e.cache._j

    class Failing:
        def __getattr__(self, name):
            return getattr(bridge, name)

        def settle(self, *args):
            raise KvShieldError("settle refused")

    e.cache._j = Failing()


def test_a_release_whose_tree_call_raises_still_releases_the_requests_pages(jvm, monkeypatch):
    """The backend's tree names only pages of its cache namespace, never a request's holds: when its
    ``cache_finished_req`` raises inside a release, the release still returns the request's pages (none leaks) and
    the exception reaches the caller (strict mode's refusals still raise). Any other exception in a release keeps
    them the request's (a stock tree or a session's slot may name them)."""
    from kvshield_sglang.errors import KvShieldError

    e, new, _ = _stale_free_setup(monkeypatch)
    _failing_settle(e)
    with pytest.raises(KvShieldError, match="settle refused"):
        with e.alloc.releasing("acme", new, leftovers=True):
            e.cache.cache_finished_req(new, kv_len_to_handle=10)
    assert _empty_pool(e, new) == (0, 16)

    e, new, _ = _stale_free_setup(monkeypatch)
    with pytest.raises(ValueError):
        with e.alloc.releasing("acme", new, leftovers=True):
            raise ValueError("the engine failed inside the release, outside the tree")
    assert _empty_pool(e, new) == (3, 4)


def test_twin_release_keeping_pages_after_a_tree_error_leaks_them(jvm, monkeypatch):
    """Planted bug: the backend does not tell the allocator its failed call named none of the request's holds, so the
    release keeps them as after a stock tree's failure: the request's three pages stay held."""
    from kvshield_sglang.errors import KvShieldError

    e, new, _ = _stale_free_setup(monkeypatch)
    _failing_settle(e)
    monkeypatch.setattr(e.alloc, "tree_call_failed", lambda: None)
    with pytest.raises(KvShieldError):
        with e.alloc.releasing("acme", new, leftovers=True):
            e.cache.cache_finished_req(new, kv_len_to_handle=10)
    assert _empty_pool(e, new) == (3, 4)
