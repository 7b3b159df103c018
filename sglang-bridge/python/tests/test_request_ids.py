"""The token allocator's host fast paths: request ids keyed by object identity and host frees copied
by one memmove. A request id is its object's for the object's life and never another's (a dead
request's id never comes back, even for a new object at the same address; two requests equal by rid
are two); a free reads exactly the slots it is given whatever the tensor's layout (int32, strided,
2-D, a storage offset, a negative view), so the pages released are the ones named and a slot the
request does not hold is still refused. A streaming session's turn serves as its session (one id) until
it leaves it; a request holding pages of its own never becomes a turn."""

import gc
import struct

import pytest

from conftest import require_module
from fakes import MHAPool

torch = require_module("torch")

SETTINGS = {"level": "ZERO", "advertisedContextTokens": 32}


class _Req:
    """A request object, as SGLang's ``Req`` is to the bridge (its identity is the object)."""

    __slots__ = ("__weakref__",)


class _RidEqualReq:
    """A request object equal to (and hashing as) any other of its rid: still its own identity."""

    def __init__(self, rid):
        self.rid = rid

    def __eq__(self, other):
        return isinstance(other, _RidEqualReq) and other.rid == self.rid

    def __hash__(self):
        return hash(self.rid)


def _pool():
    from kvshield_sglang.allocator import TokenToKVPoolAllocator

    return TokenToKVPoolAllocator(32, torch.float32, "cpu", MHAPool(32, 1), False, kvshield_settings=SETTINGS)


def test_an_object_keeps_its_id_and_two_live_objects_never_share_one():
    a = _pool()
    r1, r2 = _Req(), _Req()
    i1, i2 = a.request_id(r1), a.request_id(r2)
    assert i1 != i2
    assert a.request_id(r1) == i1 and a.request_id(r2) == i2
    assert a.request_id("named") == a.request_id("named") not in (i1, i2)


def test_a_dead_requests_id_never_comes_back_even_at_its_address():
    a = _pool()
    r = _Req()
    old_id, old_addr = a.request_id(r), id(r)
    del r
    gc.collect()
    assert old_addr not in a._request_ids, "a finished request's entry stays behind"
    seen = set()
    for _ in range(1000):  # CPython reuses a freed object's address for the next one of its size
        n = _Req()
        seen.add(a.request_id(n))
        if id(n) == old_addr:
            break
    assert old_id not in seen


def test_an_entry_whose_request_died_unnoticed_is_not_handed_to_the_new_object():
    """The identity check's planted-bug twin: an entry left under an address (its callback not run yet)
    whose weak reference is dead must not give its id to the object now at that address."""
    a = _pool()
    gone = _Req()
    stale = (__import__("weakref").ref(gone), 12345)
    del gone
    r = _Req()
    a._request_ids[id(r)] = stale
    assert a.request_id(r) != 12345
    assert a.request_id(r) == a.request_id(r)


def _allocate(a, req, n):
    a.set_plan([(req, "acme", 0, n)])
    slots = a.alloc(n)
    a.clear_plan()
    return slots


def _owners(a):
    return [a.page_owner(p) for p in range(1, 33)]


def test_every_layout_of_a_host_free_releases_exactly_the_slots_named():
    layouts = {
        "int64": lambda s: s.clone(),
        "int32": lambda s: s.to(torch.int32),
        "strided": lambda s: torch.stack((s, torch.zeros_like(s)), dim=1)[:, 0],
        "2-D": lambda s: s.reshape(2, -1),
        "negative view": lambda s: torch._neg_view(-s),  # contiguous int64 whose memory holds -s
        "storage offset": lambda s: torch.cat((torch.zeros(3, dtype=torch.int64), s))[3:],  # data_ptr past the storage's
        "size-1 dim, odd stride": lambda s: torch.as_strided(s.clone(), (s.numel(), 1), (1, 5)),  # contiguous
    }
    for name, layout in layouts.items():
        a = _pool()
        req, other = _Req(), _Req()
        slots = _allocate(a, req, 8)
        keep = _allocate(a, other, 2)
        freed = slots[[0, 2, 4, 6, 1, 3, 5, 7]]
        index = layout(freed)
        assert name != "strided" or not index.is_contiguous()
        with a.releasing("acme", req):
            a.free(index)
        a.end_step()
        owners = _owners(a)
        assert all(owners[int(s) - 1] == (None, -1) for s in slots), (name, owners)
        assert all(owners[int(s) - 1] == ("acme", a.request_id(other)) for s in keep), (name, owners)
        assert a.rejected_frees() == 0, name


def test_a_foreign_slot_in_a_host_free_is_still_refused():
    a = _pool()
    req, other = _Req(), _Req()
    slots = _allocate(a, req, 4)
    theirs = _allocate(a, other, 1)
    with a.releasing("acme", req):
        a.free(torch.cat((slots[:2], theirs, slots[2:])))
    a.end_step()
    assert a.rejected_frees() == 1
    assert a.page_owner(int(theirs[0])) == ("acme", a.request_id(other))
    assert all(a.page_owner(int(s)) == (None, -1) for s in slots)


def test_a_host_free_reads_a_tensors_values_not_its_memory():
    """A negative view's memory holds the request's own slots but its values are outside the pool: the free
    raises and releases nothing (a copy of the memory would release the pages the values do not name)."""
    from kvshield_sglang.errors import KvShieldError

    a = _pool()
    req = _Req()
    slots = _allocate(a, req, 4)
    owners = _owners(a)
    with pytest.raises(KvShieldError, match="outside the pool"):
        with a.releasing("acme", req):
            a.free(torch._neg_view(slots.clone()))
    a.end_step()
    assert _owners(a) == owners


def test_requests_equal_by_rid_keep_their_own_ids_and_pages():
    """Identity, not equality: two live requests that compare equal (one rid) get two ids, and one's release
    of both sets of slots frees its own only. Fails with ids keyed by the object (a dict or WeakKeyDictionary)."""
    a = _pool()
    r1, r2 = _RidEqualReq("same"), _RidEqualReq("same")
    assert a.request_id(r1) != a.request_id(r2)
    s1, s2 = _allocate(a, r1, 3), _allocate(a, r2, 3)
    with a.releasing("acme", r2):
        a.free(torch.cat((s2, s1)))
    a.end_step()
    assert a.rejected_frees() == 3
    assert all(a.page_owner(int(s)) == ("acme", a.request_id(r1)) for s in s1)
    assert all(a.page_owner(int(s)) == (None, -1) for s in s2)


def test_a_new_object_at_a_dead_requests_address_cannot_free_its_pages():
    """A request object that went without its release leaves its pages its own: a new object at its address
    is another request, whose free of those slots is refused and leaves them (owner and KV bytes) as they were."""
    a = _pool()
    r = _Req()
    slots = _allocate(a, r, 4)
    for buf in a.get_kvcache().buffers():
        buf[slots] = 7.0
    old_id, old_addr = a.request_id(r), id(r)
    del r
    gc.collect()
    alive = []
    while id(alive[-1] if alive else None) != old_addr and len(alive) < 1000:
        alive.append(_Req())
    assert id(alive[-1]) == old_addr, "CPython reuses a freed object's address for the next one of its size"
    with a.releasing("acme", alive[-1]):
        a.free(slots)
    a.end_step()
    assert a.rejected_frees() == 4
    assert all(a.page_owner(int(s)) == ("acme", old_id) for s in slots)
    assert (a.get_kvcache().read(slots) == 7.0).all()


def test_a_plan_that_cannot_be_written_leaves_none_and_allocations_stay_unattributed(jvm):
    a = _pool()
    a.set_plan([(_Req(), "acme", 0, 2), (_Req(), "acme", 0, 2)])
    with pytest.raises(struct.error):  # a value outside int64 (the second row's seq_len), refused midway
        a.set_plan([(_Req(), "acme", 0, 2), (_Req(), "acme", 0, 2 ** 64)])
    assert a._plan_rows == 0  # not the old plan's 2 rows over a half-overwritten buffer
    slots = a.alloc(4)
    assert {a.page_owner(int(s)) for s in slots} == {(a._props.get("defaultTenant", "default"), -1)}


def test_twin_a_half_written_plan_kept_would_attribute_pages_to_a_request_never_planned(jvm, monkeypatch):
    """Planted bug: the plan's row count is left as it was when packing stops midway."""
    from kvshield_sglang import allocator as mod

    a = _pool()
    old, new = _Req(), _Req()
    a.set_plan([(old, "acme", 0, 2), (old, "acme", 2, 4)])
    real_pack = mod._PLAN_ROW_PACK

    def planted(buf, offset, *row):
        if row[3] >= 2 ** 63:
            a._plan_rows = 2  # the bug: the old plan's rows stay counted
            raise OverflowError("seq_len outside int64")
        real_pack(buf, offset, *row)

    monkeypatch.setattr(mod, "_PLAN_ROW_PACK", planted)
    with pytest.raises(OverflowError):
        a.set_plan([(new, "acme", 0, 2), (new, "acme", 0, 2 ** 64)])
    slots = a.alloc(4)
    assert a.page_owner(int(slots[0]))[1] == a.request_id(new)  # the half-written row names the new request


class _Turn:
    """A streaming session's turn, as SGLang's ``Req`` is to :meth:`serve_as` (it names its rid in refusals)."""

    def __init__(self, rid):
        self.rid = rid


def test_a_turn_serves_as_its_session_and_a_request_holding_pages_of_its_own_is_refused(jvm):
    from kvshield_sglang.errors import KvShieldError

    a = _pool()
    session, turn, busy = _Req(), _Turn("t1"), _Turn("busy")
    a.serve_as(turn, session)
    assert a.request_id(turn) == a.request_id(session)
    slots = _allocate(a, busy, 2)
    own = a.request_id(busy)
    with pytest.raises(KvShieldError, match=r"request 'busy' \(pool id \d+\) holds 2 page\(s\) of its own"):
        a.serve_as(busy, session)
    assert a.request_id(busy) == own and a.page_owner(int(slots[0]))[1] == own  # nothing changed
    with pytest.raises(KvShieldError, match=r"streaming session request 'busy' finished as no turn of its session"):
        a.session_kept(busy, session)
    a.leave_session(turn, session)
    assert a.request_id(turn) != a.request_id(session)
