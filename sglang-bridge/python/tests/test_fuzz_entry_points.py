"""Hostile calls on every allocator entry point (seeded): random and boundary sizes, wrong dtypes and
shapes, out-of-range, stale, foreign and garbage slot indices, frees by the wrong request or tenant,
by the engine outside the tree cache's eviction, double frees in free groups, cache adoptions and
leftover releases with the wrong tenant, malformed plans and tenant names. A model of who holds each
page (a request, the tree cache, the unattributed holder, a free group) predicts what each free
releases and how many pages it refuses. Each call succeeds or fails with a clear message; a call that
fails, or whose frees were all refused, leaves the pool's state digest exactly as it was; after every
call each page's owner is the model's, and slots handed out never overlap the pages the model says
are held."""

import collections
import random

import pytest

from conftest import require_module
from fakes import MHAPool

torch = require_module("torch")

SEED = 17
CALLS = 400
PAGE = 4
SIZE = 32
PAGES = SIZE // PAGE
SLOTS = SIZE + PAGE  # page 0 is reserved
SETTINGS = {"level": "ZERO", "advertisedContextTokens": SIZE}
SIZES = [-(2 ** 63), -5, -1, 0, 1, 3, 4, 8, 12, 31, 32, 33, 36, 2 ** 31, 2 ** 63 - 1, 4.0, 4.5, "8", "x", None, float("nan")]
DTYPES = [torch.int64, torch.int32, torch.int16, torch.float32, torch.float64, torch.bool, torch.uint8]
NAMES = ["t1", "t2", "", "t1" * 200, "\u00e9", None, 3]
TENANTS = ["t1", "t2"]
# Ops by weight: 0 alloc, 1 the holder's free, 2 garbage slots, 3 a foreign free, 4 a segment, 5 cache
# adoption or leftovers, 6 a free group, 7 tenant names, 8 page owners, 9 a step boundary.
OPS = [0, 0, 0, 1, 2, 3, 4, 4, 5, 5, 6, 7, 8, 9]
EVICT = "evict"  # context: the tree cache evicting (a free outside any request, inside ``evicting()``)


def _allocator(jvm, strict):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    s = dict(SETTINGS, strict=strict)
    return PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", MHAPool(SIZE, PAGE), False,
                                       kvshield_settings=s)


def _digest(a):
    return int(a._j.pool().stateDigest())


class Model:
    """Who holds each page: ("req", name, tenant), ("cache", tenant), ("unattr",) or ("group", name, tenant)
    (freed by its request inside the open free group); each request's pages by position (its page list)."""

    def __init__(self):
        self.held = {}
        self.positions = {}

    def request_pages(self, name):
        return self.positions.setdefault(name, {})

    def allocated(self, pages, name, tenant, attributed):
        for k, p in enumerate(pages):
            if attributed:
                self.held[p] = ("req", name, tenant)
                self.request_pages(name)[k] = p
            else:
                self.held[p] = ("unattr",)

    def holds(self, ctx, page):
        """Whether the holder a free presents in context ``ctx`` holds ``page``."""
        h = self.held.get(page)
        if h is None:
            return False
        if ctx is None:
            return h == ("unattr",)
        if ctx == EVICT:
            return h[0] in ("cache", "unattr")
        tenant, name = ctx
        return h == ("req", name, tenant)

    def released(self, pages, in_group):
        for p in pages:
            h = self.held[p]
            if h[0] == "req":
                self.request_pages(h[1]).pop(next(k for k, v in self.request_pages(h[1]).items() if v == p))
            if in_group and h[0] == "req":
                self.held[p] = ("group", h[1], h[2])
            else:
                del self.held[p]

    def group_ended(self):
        for p in [p for p, h in self.held.items() if h[0] == "group"]:
            del self.held[p]

    def owners(self, a):
        def owner(h):
            if h is None:
                return (None, -1)
            if h[0] == "req":
                return (h[2], a.request_id(h[1]))
            if h[0] in ("cache", "group"):
                return (h[-1], -1)
            return ("default", -1)

        return [owner(self.held.get(p)) for p in range(PAGES + 1)]


def _free_outcome(model, ctx, idx):
    """("error", None) for a free the bridge or the pool refuses whole (a clear error, nothing changed);
    else ("ok", (freed pages, refused pages))."""
    if idx.dtype not in (torch.int64, torch.int32) or idx.numel() > SLOTS:
        return "error", None
    slots = idx.reshape(-1).tolist()
    if any(s < 0 or s >= SLOTS for s in slots):
        return "error", None
    pages = sorted({s // PAGE for s in slots})
    return "ok", ([p for p in pages if model.holds(ctx, p)], [p for p in pages if not model.holds(ctx, p)])


def _segment_outcome(model, ctx, idx, start_pos):
    """As :func:`_free_outcome` for ``free_segment``: inside a request's release its pages come from the
    request's page list by position (the slots unread) when the list names every page of the segment,
    else the slots are freed as by ``free``."""
    if idx.numel() == 0:
        return "ok", ([], [])
    if idx.dtype not in (torch.int64, torch.int32):
        return "error", None
    if ctx is None or ctx == EVICT:
        return _free_outcome(model, ctx, idx)
    head = start_pos % PAGE
    start, count = start_pos - head, idx.numel() + head
    if start + count > SLOTS:
        return "error", None
    lo, hi = -(-start // PAGE), -(-(start + count) // PAGE)
    listed = [p for pos, p in model.request_pages(ctx[1]).items() if lo <= pos < hi]
    if len(listed) != hi - lo:
        return _free_outcome(model, ctx, idx)
    return "listed", ([p for p in listed if model.holds(ctx, p)], [p for p in listed if not model.holds(ctx, p)])


def _tally(tally, model, ctx, kind, freed, refused):
    """Counts what a free exercised, by who frees and who held the pages."""
    who = "request" if isinstance(ctx, tuple) else ctx or "engine"
    for verdict, pages in (("freed", freed), ("refused", refused)):
        for p in pages:
            h = model.held.get(p)
            tally[f"{who} {verdict} {h[0] if h else 'free'}"] += 1
    if kind == "listed" and freed:
        tally["segment by position"] += 1


def _run_free(a, model, strict, ctx, call, outcome, in_group, what, tally):
    """Runs ``call`` (a free) in context ``ctx`` and checks it against the model's ``outcome``; returns
    whether the call was rejected whole (an error, or every page refused)."""
    from kvshield_sglang.errors import KvShieldError

    kind, split = outcome
    before, rejected_before = _digest(a), a.rejected_frees()
    raised = None
    try:
        if ctx is None:
            call()
        elif ctx == EVICT:
            with a.evicting():
                call()
        else:
            with a.releasing(*ctx):
                call()
    except KvShieldError as e:
        raised = e
    if kind == "error":
        assert raised is not None and str(raised) and "Traceback" not in str(raised), f"{what}: expected a clear error"
        assert _digest(a) == before, f"{what}: a refused call changed the pool"
        assert a.rejected_frees() == rejected_before, f"{what}: an error counted as a refused free"
        return True
    freed, refused = split
    assert a.rejected_frees() == rejected_before + len(refused), f"{what}: refused {refused} of {freed + refused}"
    if refused and strict:
        assert raised is not None and "ForeignAccessException" in str(raised), f"{what}: strict mode must raise"
        freed = []  # strict: nothing released
    else:
        assert raised is None, f"{what}: raised {raised!r}"
    if not freed:
        assert _digest(a) == before, f"{what}: a free whose pages were all refused changed the pool"
    _tally(tally, model, ctx, kind, freed, refused)
    model.released(freed, in_group)
    return not freed


def _contexts(model, rnd):
    live = sorted({(h[2], h[1]) for h in model.held.values() if h[0] == "req"})
    ctxs = [None, EVICT, (rnd.choice(TENANTS), f"fresh{rnd.randrange(3)}")]
    if live:
        tenant, name = rnd.choice(live)
        ctxs += [(tenant, name), ("t2" if tenant == "t1" else "t1", name)]
    return ctxs


@pytest.mark.parametrize("strict", [False, True])
def test_hostile_calls_change_nothing_when_rejected(jvm, strict):
    from kvshield_sglang.errors import KvShieldError

    rnd = random.Random(SEED)
    a = _allocator(jvm, strict)
    a.tenant_id("t1")  # registering a tenant changes the digest: do it before any comparison
    a.tenant_id("t2")
    model = Model()
    clear_errors = (KvShieldError, TypeError, ValueError, NotImplementedError)
    rejected_calls = 0
    tally = collections.Counter()
    for i in range(CALLS):
        op = rnd.choice(OPS)
        before = _digest(a)
        what = f"call {i} (op {op})"
        try:
            if op == 0:
                n = rnd.choice(SIZES) if rnd.random() < 0.5 else rnd.choice([4, 8, 12])
                tenant = rnd.choice(TENANTS)
                seq = n if isinstance(n, int) and 0 < n <= SIZE else PAGE
                planned = rnd.random() < 0.8  # else the engine allocates with no plan: unattributed pages
                a.set_plan([(f"r{i}", tenant, 0, seq)] if planned else [])
                try:
                    got = a.alloc(n)
                finally:
                    a.clear_plan()
                if got is None or not got.numel():
                    assert _digest(a) == before, f"{what}: alloc({n!r}) gave nothing and changed the pool"
                    rejected_calls += got is None
                else:
                    slots = got.tolist()
                    pages = [s // PAGE for s in slots[::PAGE]]
                    assert slots == [p * PAGE + k for p in pages for k in range(PAGE)], f"{what}: not whole pages"
                    assert not set(pages) & set(model.held), f"{what}: alloc({n!r}) handed out held pages {pages}"
                    model.allocated(pages, f"r{i}", tenant, attributed=planned and -(-seq // PAGE) == len(pages))
            elif op == 1 and model.held:
                # The holder frees its own page: the request, the cache evicting, the engine (unattributed).
                page, h = rnd.choice(sorted(model.held.items()))
                if h[0] == "group":
                    continue
                ctx = (h[2], h[1]) if h[0] == "req" else EVICT if h[0] == "cache" else rnd.choice([None, EVICT])
                idx = torch.arange(page * PAGE, page * PAGE + PAGE, dtype=rnd.choice([torch.int64, torch.int32]))
                outcome = _free_outcome(model, ctx, idx)
                assert outcome[1] == ([page], []), f"{what}: the model's holder does not hold page {page}"
                _run_free(a, model, strict, ctx, lambda: a.free(idx), outcome, False, what, tally)
            elif op == 2:
                idx = _garbage_slots(rnd, model)
                ctx = rnd.choice(_contexts(model, rnd))
                outcome = _free_outcome(model, ctx, idx)
                rejected_calls += _run_free(a, model, strict, ctx, lambda: a.free(idx), outcome, False, what, tally)
            elif op == 3 and model.held:
                # A foreign free: a context that does not hold a held page frees it.
                cached = sorted(p for p, h in model.held.items() if h[0] == "cache")
                page = rnd.choice(cached if cached and rnd.random() < 0.5 else sorted(model.held))
                h = model.held[page]
                others = [("t1", f"fresh{i}"), ("t2", f"fresh{i}")]
                if h[0] in ("req", "group"):  # another request of its tenant or of the other one, the engine, the cache
                    others += [(h[2], f"fresh{i}"), ("t2" if h[2] == "t1" else "t1", h[1]), None, EVICT, None, EVICT]
                elif h[0] == "cache":  # a stale engine free outside the cache's eviction
                    others += [None, None]
                ctx = rnd.choice(others)
                assert not model.holds(ctx, page)
                idx = torch.tensor([page * PAGE + rnd.randrange(PAGE)], dtype=torch.int64)
                outcome = _free_outcome(model, ctx, idx)
                assert outcome == ("ok", ([], [page]))
                assert _run_free(a, model, strict, ctx, lambda: a.free(idx), outcome, False, what, tally)
                rejected_calls += 1
            elif op == 4:
                # A segment: by position from the request's page list, or by its slots.
                held_slots = [p * PAGE + k for p in model.held for k in range(PAGE)]
                slot = rnd.choice(sorted(held_slots)) if held_slots and rnd.random() < 0.7 else PAGE + 1
                h = model.held.get(slot // PAGE)
                ctx = (h[2], h[1]) if h and h[0] == "req" and rnd.random() < 0.7 else rnd.choice(_contexts(model, rnd))
                start_pos = rnd.choice([0, 1, 2, 3, 4, 5, 7, 8, 30, 40])
                idx = torch.tensor([slot], dtype=torch.int64)
                outcome = _segment_outcome(model, ctx, idx, start_pos)
                rejected_calls += _run_free(a, model, strict, ctx, lambda: a.free_segment(idx, start_pos=start_pos),
                                            outcome, False, what, tally)
            elif op == 5:
                # The tree cache takes a request's pages (up to a position; with the wrong tenant none),
                # or the request's leftovers are released.
                live = sorted({(h[2], h[1]) for h in model.held.values() if h[0] == "req"})
                tenant, name = rnd.choice(live) if live and rnd.random() < 0.8 else ("t1", f"fresh{i}")
                listed = model.request_pages(name)
                if rnd.random() < 0.6:
                    if rnd.random() < 0.25:
                        tenant = "t2" if tenant == "t1" else "t1"
                    to_pos = rnd.choice([-1, 0, 3, 4, 8, 9, 100])
                    a.cache_took(name, tenant, to_pos)
                    to_page = -1 if to_pos < 0 else to_pos // PAGE
                    for pos, p in sorted(listed.items()):
                        if (to_page < 0 or pos < to_page) and model.held[p] == ("req", name, tenant):
                            model.held[p] = ("cache", tenant)
                            del listed[pos]
                            tally["adopted"] += 1
                else:
                    a.release_leftovers(name, tenant)
                    for p in listed.values():
                        assert model.held[p] == ("req", name, tenant)
                        del model.held[p]
                        tally["leftovers"] += 1
                    listed.clear()
            elif op == 6:
                # One free group: requests free pages (some twice); released together at its end.
                a.free_group_begin()
                try:
                    for _ in range(rnd.randint(1, 4)):
                        cands = sorted(p for p, h in model.held.items() if h[0] in ("req", "group"))
                        if not cands:
                            break
                        page = rnd.choice(cands)
                        h = model.held[page]
                        ctx = (h[2], h[1])
                        idx = torch.arange(page * PAGE, page * PAGE + PAGE)
                        outcome = _free_outcome(model, ctx, idx)
                        assert outcome[1] == (([page], []) if h[0] == "req" else ([], [page]))
                        _run_free(a, model, strict, ctx, lambda: a.free(idx), outcome, True, what, tally)
                    assert model.owners(a) == [a.page_owner(p) for p in range(PAGES + 1)], f"{what}: inside the group"
                finally:
                    a.free_group_end()
                    model.group_ended()
            elif op == 7:
                a.tenant_id(rnd.choice(NAMES))
            elif op == 8:
                a.page_owner(rnd.choice([-1, 0, PAGES, PAGES + 1, 2 ** 31 - 1]))
            else:
                a.end_step()
        except clear_errors as e:
            assert str(e), f"{what} failed without a message: {type(e).__name__}"
            assert "Traceback" not in str(e)
            assert _digest(a) == before, f"{what} failed with {e!r} and changed the pool"
            rejected_calls += 1
        assert model.owners(a) == [a.page_owner(p) for p in range(PAGES + 1)], f"{what}: owners differ from the model"
    assert rejected_calls > CALLS // 5, f"too few hostile calls were rejected: {rejected_calls}"
    # Every kind of free the model tells apart happened (stale frees of released pages included).
    exercised = [("request freed req",), ("evict freed cache",), ("evict freed unattr", "engine freed unattr"),
                 ("request refused req",), ("request refused group",), ("request refused free",),
                 ("request refused cache", "request refused unattr"), ("engine refused req", "evict refused req"),
                 ("engine refused cache",), ("segment by position",), ("adopted",), ("leftovers",)]
    assert all(any(tally[k] for k in kinds) for kinds in exercised), sorted(tally.items())
    a.close()


def _garbage_slots(rnd, model):
    kind = rnd.randrange(6)
    if kind == 0:
        return torch.tensor([rnd.choice([-1, -(2 ** 40), SLOTS, 2 ** 40])], dtype=torch.int64)  # out of range
    if kind == 1:
        return torch.tensor([0, 1, 2, 3], dtype=torch.int64)  # page 0 is reserved
    if kind == 2:
        dead = [s for s in range(PAGE, SLOTS) if s // PAGE not in model.held]
        return torch.tensor(rnd.sample(dead, min(len(dead), 1 + rnd.randrange(4))) or [PAGE], dtype=torch.int64)  # stale
    if kind == 3:
        return torch.rand(3) * SIZE  # float dtype
    if kind == 4:
        return torch.zeros((SIZE * 4,), dtype=torch.int64)  # more slots than the pool
    return torch.tensor([[PAGE, PAGE + 1]], dtype=rnd.choice(DTYPES))  # wrong shape or dtype
