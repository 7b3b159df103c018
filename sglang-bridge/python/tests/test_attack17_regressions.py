"""Attack round 17 on the ``kvshield`` radix-cache backend (SGLang's real ``Req``, ``ReqToTokenPool`` and
scheduler calls through ``prefix_driver.Engine``). Each test failed on the code it was written against because of
the finding it names; the twin plants the defect back and must fail."""

from array import array
from types import SimpleNamespace

import pytest

from conftest import require_module

torch = require_module("torch")
P = list(range(1000, 1010))  # 2 full pages of 4 tokens + a partial one


def _engine(level="ZERO", shared=None, size=64):
    from kvshield_sglang.prefix_cache import KvShieldPrefixCache
    from prefix_driver import Engine

    return Engine(lambda p, s: KvShieldPrefixCache(p, shared_tenant=s), level=level, shared=shared, size=size)


def test_finish_with_committed_len_below_the_protected_prefix_releases_lock_and_pages(jvm, monkeypatch):
    """Finding 1: a retracted reasoning request re-prefilled in chunks, with ``--strip-thinking-cache``, wedges
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
    """Finding 1, variant (same cause): no chunking needed. The tenant's own cache already holds the
    retracted request's prompt plus answer, e.g. a later chat turn whose prompt is this turn's prompt and
    answer. The re-admitted request matches 8 tokens, ``effective_kv_committed_len()`` is 5, and
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
