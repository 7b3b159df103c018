"""A request's release whose host free waits in ``io`` for the release's end (design note 26) against the
same release with every free crossing at once (``_may_hold`` off): the pool must end the same. Compared
after each release: every page's life-cycle state and owner, the refusal counter, ``available_size()``,
what the release read inside (``available_size``, ``free_pages``, allocations), the KV bytes of every slot
(a live request of another tenant reads back what it wrote) and, under COMPLIANCE, the audit trail's
records. Seeded operation sequences reach every crossing the brief names (device and host frees, tree
keeps, segments, evictions, cache adoptions, explicit leftovers, free groups, step boundaries, nested
releases, exceptions); each oracle has a planted-bug twin."""

import json
import random

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, MHAPool, install_fake_cuda

torch = require_module("torch")

SETTINGS = {"level": "ZERO", "advertisedContextTokens": 32, "strict": False}
SEEDS = range(6)
STATES = 7  # PageState ordinals: FREE, SEALED, OWNED, QUARANTINED, RETIRED, ...


def _allocator(page_size, settings=SETTINGS):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    if page_size == 1:
        return TokenToKVPoolAllocator(16, torch.float32, "cpu", MHAPool(16, 1), False, kvshield_settings=settings)
    return PagedTokenToKVPoolAllocator(32, page_size, torch.float32, "cpu", MHAPool(32, page_size), False,
                                       kvshield_settings=settings)


def _at_once(monkeypatch):
    """Every request's host free crosses at its call (the path before note 26)."""
    from kvshield_sglang.allocator import _KvShieldMixin

    monkeypatch.setattr(_KvShieldMixin, "_may_hold", property(lambda self: False))


def _pool_state(a):
    """Pages per life-cycle state, every page's owner, refusals, available slots, every slot's KV bytes.
    Read through ``_jalloc`` so that taking it runs no held free."""
    j, ids = a._jalloc, a._page_ids
    states = tuple(tuple(ids[0:int(j.pagesIn(1 << k, ids))]) for k in range(STATES))
    owners = tuple((int(j.tenantOf(p)), int(j.requestOf(p))) for p in range(a.size // a.page_size + 1))
    kv = a.get_kvcache().read(torch.arange(a.size + a.page_size)).tolist()
    return states, owners, int(j.rejectedFrees()), a.available_size(), kv


class World:
    """A seeded scheduler-like sequence on one allocator: allocations of requests of two tenants (each writes
    its own value into its KV), releases whose bodies free own, foreign, stale, duplicated, int32 and device
    slots and cross every other way, step boundaries and free groups. Each top-level step draws from its own
    seed, so a step that ends early on one side leaves the next steps as they were."""

    def __init__(self, page_size, seed):
        self.a = _allocator(page_size)
        self.ps, self.seed, self.rng = page_size, seed, random.Random()
        self.log, self.slots, self.tenants = [], {}, {}

    def _pick(self):
        r = self.rng
        pool = [s for v in self.slots.values() for s in v]
        if r.random() < 0.05 or not pool:
            return torch.tensor([], dtype=torch.int64)
        if r.random() < 0.5:
            pool = self.slots[r.choice(sorted(self.slots))] or pool
        k = r.randint(1, min(len(pool), 3 * self.ps))
        start = r.randrange(0, len(pool) - k + 1)
        t = torch.tensor(pool[start:start + k])
        if r.random() < 0.2:
            t = torch.cat([t, t[:1]])  # a slot twice
        return t.to(torch.int32) if r.random() < 0.3 else t

    def _device(self, t):
        return DeviceOnlyTensor(t.tolist(), t.dtype)

    def _new(self, sizes):
        a = self.a
        names = [f"r{len(self.tenants) + i}" for i in range(len(sizes))]
        for n in names:
            self.tenants[n] = self.rng.choice(["t1", "t2"])
            self.slots[n] = []
        a.set_plan([(n, self.tenants[n], 0, s) for n, s in zip(names, sizes)])
        try:
            got = a.alloc(sum(sizes))
        finally:
            a.clear_plan()
        self.log.append(("alloc", None if got is None else got.tolist()))
        if got is not None:
            off = 0
            for n, s in zip(names, sizes):
                self.slots[n] = got[off:off + s].tolist()
                for buf in a.get_kvcache().buffers():
                    buf[got[off:off + s]] = 1.0 + int(n[1:])
                off += s

    def _body_op(self, depth, ctx):
        a, r = self.a, self.rng
        op = r.randrange(19)
        if op <= 2:
            a.free(self._pick())
        elif op == 3:
            t = self._pick()
            a.free(self._device(t) if t.numel() else t)
        elif op == 4:
            self.log.append(("available", a.available_size()))
        elif op == 5:
            self.log.append(("free_pages", a.free_pages.tolist()))
        elif op == 6:
            a.tree_kept(self._pick())
        elif op == 7:
            t = self._pick()
            if t.numel():
                a.free_segment(self._device(t) if r.random() < 0.5 else t, start_pos=r.randrange(0, 2 * self.ps))
        elif op == 8:
            with a.evicting():
                a.free(self._pick())
        elif op == 9:
            self.log.append(("refused", a.rejected_frees()))
        elif op == 10 and depth < 2:
            self._release(depth + 1)
        elif op == 11:
            self._new([self.ps])
        elif op == 12 and self.tenants:
            name = r.choice(sorted(self.tenants))
            a.cache_took(name, self.tenants[name])
        elif op == 13 and self.tenants:
            name = r.choice(sorted(self.tenants))
            a.release_leftovers(name, self.tenants[name])
        elif op == 14:
            a.begin_step()
        elif op == 15:
            self.log.append(("steps", a.end_step()))
        elif op == 16:
            with a.releasing(*ctx, leftovers=r.random() < 0.5):  # the same request's release, nested
                a.free(self._pick())
        elif op == 17:
            a.free_group_begin() if a.is_not_in_free_group else a.free_group_end()
        else:
            t = self._pick()
            if t.numel():
                a.tree_kept(self._device(t))

    def _release(self, depth):
        from kvshield_sglang.errors import KvShieldError

        if not self.tenants:
            return
        r = self.rng
        name = r.choice(sorted(self.tenants))
        ctx = (self.tenants[name], name)
        leftovers, boom = r.random() < 0.7, r.random() < 0.1
        try:
            with self.a.releasing(*ctx, leftovers=leftovers):
                for _ in range(r.randint(0, 3)):
                    self._body_op(depth, ctx)
                if boom:
                    raise ValueError("the engine failed inside the release")
        except ValueError:
            self.log.append("raised")
        except KvShieldError as e:
            self.log.append(("error", str(e)))
        self.log.append(("released", _pool_state(self.a)))

    def run(self, steps):
        from kvshield_sglang.errors import KvShieldError

        a = self.a
        for step in range(steps):
            self.rng.seed(self.seed * 100003 + step)
            x = self.rng.random()
            try:
                if x < 0.03:  # a slot outside the pool: the held free raises at the release's end
                    with a.releasing("t1", "bad", leftovers=True):
                        a.free(torch.tensor([3, a.size + a.page_size + 5]))
                elif x < 0.3:
                    self._new([self.ps * self.rng.randint(1, 2) for _ in range(self.rng.randint(1, 3))])
                elif x < 0.85:
                    self._release(0)
                elif x < 0.9:
                    a.free_group_begin() if a.is_not_in_free_group else a.free_group_end()
                else:
                    a.end_step()
            except KvShieldError as e:
                self.log.append(("error", str(e)))
        if not a.is_not_in_free_group:
            a.free_group_end()
        a.end_step()
        self.log.append(("final", _pool_state(a)))
        return self.log


def _world(monkeypatch, hold, page_size, seed, steps=40):
    install_fake_cuda(monkeypatch)
    if not hold:
        _at_once(monkeypatch)
    try:
        return World(page_size, seed).run(steps)
    finally:
        monkeypatch.undo()


def _first_difference(held, at_once):
    for i, (h, u) in enumerate(zip(held, at_once)):
        if h != u:
            return i, h, u
    return (None,) if len(held) == len(at_once) else (min(len(held), len(at_once)), "length", "length")


@pytest.mark.parametrize("page_size", [1, 4])
def test_seeded_releases_end_as_the_at_once_path_does(jvm, monkeypatch, page_size):
    for seed in SEEDS:
        held = _world(monkeypatch, True, page_size, seed)
        at_once = _world(monkeypatch, False, page_size, seed)
        assert _first_difference(held, at_once) == (None,), f"seed {seed}"
        assert any(e[0] == "released" and e[1][2] for e in held if isinstance(e, tuple)), "no refusal was exercised"


class _ForgetsTheHeldFree:  # planted bug: tree_kept writes io without running the held free first
    def tree_kept(self, slots):
        self._held = None
        return super().tree_kept(slots)


def test_twin_a_crossing_that_forgets_the_held_free_is_seen(jvm, monkeypatch):
    from kvshield_sglang import allocator

    unplanted = _allocator

    def planted(page_size, settings=SETTINGS):
        cls = {1: allocator.TokenToKVPoolAllocator}.get(page_size, allocator.PagedTokenToKVPoolAllocator)
        a = unplanted(page_size, settings)
        a.__class__ = type("Planted", (_ForgetsTheHeldFree, cls), {})
        return a

    differences = []
    for seed in SEEDS:
        at_once = _world(monkeypatch, False, 4, seed)
        monkeypatch.setattr(__import__(__name__), "_allocator", planted)
        differences.append(_first_difference(_world(monkeypatch, True, 4, seed), at_once))
    assert any(d != (None,) for d in differences), "the oracle above cannot fail"


# ------------------------------------------------------------------ the audit trail


def _trail_records(tmp_path, monkeypatch, hold, page_size, body):
    """Runs ``body(a, sa, sb)`` inside request A's release (leftovers) on a COMPLIANCE pool (A of t1 and B of t2
    hold half the pool each), then a step boundary; returns the trail's records as (type, tenant, request, pages),
    but those of the protection worker (``protect_done``, ``free``), which it batches as its thread gets to them."""
    import jpype

    keys = tmp_path / "keys"
    if not keys.exists():
        keys.mkdir()
        jpype.JClass("dev.kvshield.audit.AuditKeys").generate(jpype.JClass("java.nio.file.Path").of(str(keys)))
    trail = tmp_path / f"trail-{hold}"
    monkeypatch.setenv("KVSHIELD_AUDIT_SIGNING_KEY", str(keys / "audit-signing.key"))
    monkeypatch.setenv("KVSHIELD_AUDIT_DIR", str(trail))
    if not hold:
        _at_once(monkeypatch)
    try:
        a = _allocator(page_size, dict(SETTINGS, level="COMPLIANCE"))
        half = a.size // 2
        a.set_plan([("A", "t1", 0, half), ("B", "t2", 0, half)])
        slots = a.alloc(a.size)
        a.clear_plan()
        with a.releasing("t1", "A", leftovers=True):
            body(a, slots[:half], slots[half:])
        a.end_step()
        a.close()
    finally:
        monkeypatch.undo()
    lines = [json.loads(x) for f in sorted(trail.iterdir()) for x in f.read_text().splitlines() if x]
    return [(r["type"], r.get("tenant"), r.get("req"), r.get("pages")) for r in lines
            if r["type"] not in ("open", "checkpoint", "protect_done", "free")]


TRAIL_RELEASES = {
    # SGLang's radix release: the duplicates freed, the insert keeps a page, the unaligned tail freed
    "free-kept-free": lambda a, sa, sb: (a.free(sa[:a.page_size]), a.tree_kept(sa[a.page_size:2 * a.page_size]),
                                         a.free(sa[2 * a.page_size:3 * a.page_size])),
    "two-frees": lambda a, sa, sb: (a.free(sa[a.page_size:2 * a.page_size]), a.free(sa[:a.page_size])),
    "two-frees-one-foreign": lambda a, sa, sb: (a.free(sa[2 * a.page_size:3 * a.page_size]),
                                                a.free(torch.cat((sb[:a.page_size], sa[:a.page_size])))),
}


@pytest.mark.parametrize("page_size", [1, 4])
@pytest.mark.parametrize("kind", sorted(TRAIL_RELEASES))
def test_a_release_of_several_frees_audits_as_the_at_once_path(jvm, tmp_path, monkeypatch, kind, page_size):
    """The pages of a release's frees reach the pool (quarantine, protection, trail) in call order: the
    held last free after the earlier ones, in the same release record."""
    held = _trail_records(tmp_path, monkeypatch, True, page_size, TRAIL_RELEASES[kind])
    at_once = _trail_records(tmp_path, monkeypatch, False, page_size, TRAIL_RELEASES[kind])
    assert held == at_once
    assert [r[0] for r in held].count("release") == 1


def test_twin_a_release_that_reorders_its_pages_is_seen_in_the_trail(jvm, tmp_path, monkeypatch):
    """Planted bug: the release's end releases the leftovers ahead of the held free."""
    from kvshield_sglang.allocator import _Releasing

    at_once = _trail_records(tmp_path, monkeypatch, False, 4, TRAIL_RELEASES["two-frees"])
    orig_exit = _Releasing.__exit__

    def reordering_exit(self, *exc):
        a = self._alloc
        a._jalloc.releaseLeftovers(a._releasing_request, a._releasing_tenant, 0)
        return orig_exit(self, *exc)

    monkeypatch.setattr(_Releasing, "__exit__", reordering_exit)
    held = _trail_records(tmp_path, monkeypatch, True, 4, TRAIL_RELEASES["two-frees"])
    assert held != at_once, "the oracle above cannot fail"


def test_a_release_of_one_free_audits_as_the_at_once_path_but_its_deferred_free_hold(jvm, tmp_path, monkeypatch):
    """One free (the one-crossing release): the same records but the ownership transfer to the deferred-free
    hold, which the held path never mints (note 26)."""
    def body(a, sa, sb):
        a.free(torch.cat((sa[:4], sb[:4])))

    held = _trail_records(tmp_path, monkeypatch, True, 4, body)
    at_once = _trail_records(tmp_path, monkeypatch, False, 4, body)
    assert held == [r for r in at_once if r[0] != "ownership_transfer"]
    assert [r[0] for r in at_once].count("ownership_transfer") == 1 and ("reject_foreign", 1, 0, [[5, 1]]) in held
