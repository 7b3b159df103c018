"""Prefill→decode handoffs between two bridged pools on CPU tensors; the transfer is a tensor copy
driven through the handoff API. Every scenario's oracle reads bytes back from the decode tensors and
has a planted-bug twin (in this file) that must make it fail."""

import pytest

from conftest import require_module
from fakes import MHAPool, MLAPool

torch = require_module("torch")
PEER = 7
SIZE, PAGE = 32, 4


def _alloc(limit=32, level="ZERO"):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    kv = MHAPool(SIZE, PAGE, layers=2)
    a = PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", kv, False, kvshield_settings={
        "level": level, "strict": True, "advertisedContextTokens": limit})
    return a, kv




class Pair:
    """Prefill and decode pools, handshaken, and the client's view of each request."""

    def __init__(self, prefill_limit=32, decode_limit=32, handshake=True):
        from kvshield_sglang.handoff import Handoff

        self.pa, self.pkv = _alloc(prefill_limit)
        self.da, self.dkv = _alloc(decode_limit)
        self.prefill, self.decode = Handoff(self.pa), Handoff(self.da)
        if handshake:
            self.prefill.handshake(PEER, self.decode.effective_limit())
            self.decode.handshake(PEER, self.prefill.effective_limit())

    def prefill_request(self, rid, tenant, seq, value):
        """Prefill computes ``seq`` tokens of KV (token i of request holds value + i) and starts the transfer."""
        self.pa.set_plan([(rid, tenant, 0, seq)])
        slots = self.pa.alloc(-(-seq // PAGE) * PAGE)
        self.pa.clear_plan()
        for b in self.pkv.buffers():
            b[slots[:seq]] = (value + torch.arange(seq, dtype=torch.float32))[:, None, None]
        self.prefill.begin(rid, tenant, seq, slots, PEER)
        return slots[:seq]


def client_view(pair, decode_slots, run):
    """What the client gets: (status, finish, bytes decode read). A HandoffError becomes SGLang's abort."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    from kvshield_sglang.disagg import fail_request
    from kvshield_sglang.errors import HandoffError

    req = Req("client", "", array("q", [1]), SamplingParams())
    try:
        run()
    except HandoffError as e:
        fail_request(req, e)
        finish = req.finished_reason.to_json()
        return finish["status_code"], finish["type"], None
    return 200, "length", pair.dkv.read(decode_slots())


def assert_safe(view, expected):
    """The oracle: a 200 "length" finish only over exactly the bytes prefill computed; otherwise an abort with 4xx/5xx."""
    status, finish, seen = view
    if status == 200:
        assert finish == "length"
        assert torch.equal(seen, expected), "decode served bytes prefill never sent"
    else:
        assert finish == "abort" and status >= 400


class AcceptsPartialCoverage:
    """Planted bug: the decode side commits whatever the sender published (the incident's "length"/200)."""

    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)

    def commit(self, rid, covered_tokens):
        return True


# ---------------------------------------------------------------- happy path (the oracle can pass)

def test_full_transfer_commits_with_exact_bytes(jvm):
    p = Pair()
    expected_slots = p.prefill_request("r1", "t1", 10, 100.0)
    expected = p.pkv.read(expected_slots)
    dslots = p.decode.reserve("r1", "t1", 10, PEER)

    def run():
        p.prefill.copy_to(p.decode, "r1")
        p.prefill.mark_sent("r1", 10)
        p.decode.commit("r1", p.prefill.sent_tokens("r1"))

    view = client_view(p, lambda: dslots, run)
    assert view[0] == 200
    assert_safe(view, expected)
    p.decode.acknowledge("r1")
    p.prefill.complete("r1")
    assert p.decode.outcome("r1") == "COMMITTED"


# ---------------------------------------------------------------- rejected oversized

def _oversized(decode):
    """The incident: prefill rejects an oversized prompt; SGLang used to shrink it to a one-token
    placeholder and still hand off, with decode reserving the full length."""
    p = Pair()
    limit = p.prefill.effective_limit()
    before = p.da.available_size()
    from kvshield_sglang.errors import HandoffError

    with pytest.raises(HandoffError) as e:
        p.prefill.begin("big", "t1", limit + 1, torch.empty(0, dtype=torch.int64), PEER)  # admission comes first
    assert e.value.status_code == 400 and str(limit + 1) in str(e.value)
    # Decode never reserves for a request prefill rejected; if asked, it rejects before reserving too.
    with pytest.raises(HandoffError) as d:
        p.decode.reserve("big", "t1", limit + 1, PEER)
    assert d.value.status_code == 400
    assert p.da.available_size() == before
    assert all(torch.count_nonzero(b).item() == 0 for b in p.dkv.buffers()), "decode holds bytes of a rejected request"
    # The shrunk placeholder (1 token) going through anyway, against a decode reservation of the limit:
    placeholder = p.prefill_request("big", "t1", 1, 5.0)
    dec = decode(p.decode)
    dslots = dec.reserve("big", "t1", limit, PEER)
    for b in p.dkv.buffers():  # stale KV of an earlier request on the decode pool's memory
        b[dslots] = -9.0
    expected = torch.cat([p.pkv.read(placeholder), torch.zeros(4, limit - 1, 1, 4)], dim=1)

    def run():
        p.prefill.copy_to(p.decode, "big", 0, 1)
        p.prefill.mark_sent("big", 1)
        dec.commit("big", p.prefill.sent_tokens("big"))

    return client_view(p, lambda: dslots, run), expected


def test_rejected_oversized_never_hands_off(jvm):
    view, expected = _oversized(lambda real: real)
    assert view[:2] == (500, "abort")
    assert_safe(view, expected)


def test_twin_accepting_partial_coverage_serves_stale_bytes(jvm):
    view, expected = _oversized(AcceptsPartialCoverage)
    with pytest.raises(AssertionError, match="never sent"):
        assert_safe(view, expected)


# ---------------------------------------------------------------- one page written of many

def _one_page_of_many(decode, published):
    p = Pair()
    slots = p.prefill_request("r", "t1", 16, 10.0)
    expected = p.pkv.read(slots)
    dec = decode(p.decode)
    dslots = dec.reserve("r", "t1", 16, PEER)

    def run():
        p.prefill.copy_to(p.decode, "r", 0, 1)  # only the first of four pages lands
        p.prefill.mark_sent("r", published)
        dec.commit("r", p.prefill.sent_tokens("r"))

    return client_view(p, lambda: dslots, run), expected, p


@pytest.mark.parametrize("published,outcome", [(4, "REFUSED_COVERAGE"), (16, "REFUSED_UNWRITTEN")])
def test_one_page_written_of_many_is_refused(jvm, published, outcome):
    view, expected, p = _one_page_of_many(lambda real: real, published)
    assert view[:2] == (500, "abort")
    assert_safe(view, expected)
    assert p.decode.outcome("r") == outcome


@pytest.mark.parametrize("published", [4, 16])
def test_twin_accepting_partial_coverage_commits_unwritten_pages(jvm, published):
    view, expected, _ = _one_page_of_many(AcceptsPartialCoverage, published)
    with pytest.raises(AssertionError, match="never sent"):
        assert_safe(view, expected)


# ---------------------------------------------------------------- aborted request, late write

def _late_write(twin):
    """Decode aborts request A mid-transfer; A's pages go to request B of another tenant; A's transfer
    writes late. Returns what B reads and what B wrote."""
    from kvshield_sglang.errors import HandoffError

    p = Pair()
    p.prefill_request("A", "t1", 8, 50.0)
    a_slots = p.decode.reserve("A", "t1", 8, PEER)
    p.decode.abort("A")  # the client cancelled
    p.prefill.copy_to(p.decode, "A", 0, 1)  # a write still in flight lands in quarantine (claims live)
    p.decode.acknowledge("A")  # the transport acknowledged the abort: claims drop, pages get scrubbed
    p.da.end_step()
    p.da.set_plan([("B", "t2", 0, SIZE)])  # B takes every page, so A's pages too
    b_slots = p.da.alloc(SIZE)
    p.da.clear_plan()
    assert set(a_slots.tolist()) <= set(b_slots.tolist())
    assert torch.count_nonzero(p.dkv.read(b_slots)).item() == 0, "the write that landed in quarantine was not scrubbed"
    for b in p.dkv.buffers():
        b[b_slots] = 3.0
    expected = p.dkv.read(b_slots).clone()
    if twin:  # planted bug: the transport writes A's KV by the slots it was given, no claim or generation check
        for b in p.dkv.buffers():
            b[a_slots] = 50.0
    else:
        with pytest.raises(HandoffError, match="no handoff reservation"):
            p.prefill.copy_to(p.decode, "A", 0, 2)  # A's transfer was acknowledged: nothing writes through
    p.prefill.complete("A")
    return p.dkv.read(b_slots), expected


def test_aborted_request_late_write_never_lands_in_another_request(jvm):
    seen, expected = _late_write(twin=False)
    assert torch.equal(seen, expected)


def test_twin_without_generation_check_corrupts_the_next_request(jvm):
    seen, expected = _late_write(twin=True)
    assert not torch.equal(seen, expected)


# ---------------------------------------------------------------- lost acknowledgement

def _lost_ack(free_on_timeout):
    """A's transfer is done by a NIC that writes decode memory itself (raw tensor copy, then
    record_written) and never acknowledges. Returns (what B read, what B wrote, decode pair)."""
    p = Pair()
    src = p.prefill_request("A", "t1", 8, 70.0)
    a_slots = p.decode.reserve("A", "t1", 8, PEER)
    for b_src, b_dst in zip(p.pkv.buffers(), p.dkv.buffers()):
        b_dst[a_slots[:4]] = b_src[src[:4]]
    p.decode.record_written("A", 0, 0, 4)
    if free_on_timeout:  # planted bug: the timeout is treated as a free
        p.decode.abort("A")
        p.decode.acknowledge("A")
    else:
        p.decode.expire("A")
    p.da.end_step()
    p.da.set_plan([("B", "t2", 0, 8)])
    b_slots = p.da.alloc(8)
    p.da.clear_plan()
    for b in p.dkv.buffers():
        b[b_slots] = 3.0
    expected = p.dkv.read(b_slots).clone()
    for b_src, b_dst in zip(p.pkv.buffers(), p.dkv.buffers()):  # the NIC finishes A's transfer late
        b_dst[a_slots] = b_src[src]
    return p.dkv.read(b_slots), expected, p


def test_lost_acknowledgement_keeps_pages_quarantined(jvm):
    seen, expected, p = _lost_ack(free_on_timeout=False)
    assert torch.equal(seen, expected)
    assert p.decode.outcome("A") == "EXPIRED"
    assert p.decode.unacknowledged() == 1
    assert len(p.decode.alarms()) == 1 and "never acknowledged" in p.decode.alarms()[0]
    # Back-pressure: A's two pages stay out of circulation; a request needing them waits.
    assert p.da.available_size() == SIZE - 8 - 8
    assert p.decode.reserve("C", "t3", SIZE - 8, PEER) is None
    assert "claim" in p.decode.last_shortfall()


def test_twin_freeing_on_timeout_lets_the_late_write_land(jvm):
    seen, expected, _ = _lost_ack(free_on_timeout=True)
    assert not torch.equal(seen, expected)


# ---------------------------------------------------------------- limit mismatch at the handshake

def _refuses_mismatch(handshake):
    from kvshield_sglang.errors import HandoffError

    p = Pair(prefill_limit=32, decode_limit=16, handshake=False)
    mine, theirs = p.decode.effective_limit(), p.prefill.effective_limit()
    assert mine != theirs
    with pytest.raises(HandoffError) as e:
        handshake(p.decode, PEER, theirs)
    assert str(mine) in str(e.value) and str(theirs) in str(e.value)
    with pytest.raises(HandoffError, match="no handshake"):
        p.decode.reserve("r", "t1", 8, PEER)


def test_limit_mismatch_refuses_the_handshake_naming_both(jvm):
    _refuses_mismatch(lambda side, peer, limit: side.handshake(peer, limit))


def test_twin_skipping_the_limit_check_accepts_the_peer(jvm):
    def skip(side, peer, limit):  # planted bug: the peer is recorded with our own limit, never compared
        side.handshake(peer, side.effective_limit())

    with pytest.raises(BaseException) as e:
        _refuses_mismatch(skip)
    assert e.type.__name__ in ("Failed", "AssertionError")


# ---------------------------------------------------------------- deferred frees before page moves

class MovesPagesAheadOfDeferredFrees:
    """Planted bug: the handoff's page moves go to Java without resolving the frees deferred before them."""

    @staticmethod
    def install(handoff):
        handoff._move = handoff._call


def _deferred_double_free_then_reserve(monkeypatch, twin=None):
    """SGLang releases request B's slots, then frees them again from device indices (deferred), both inside
    B's release (so both present B's holds); B, re-bootstrapped (SGLang's PD retraction: the same request),
    then reserves every page of the decode pool, its old pages included, and its transfer lands. The
    deferred double free must reach the pool before the reservation and be refused there (B holds nothing
    then), not present B's new reservation holds and release its pages under its transfer."""
    from fakes import DeviceOnlyTensor, install_fake_cuda
    from kvshield_sglang.errors import KvShieldError

    install_fake_cuda(monkeypatch)
    p = Pair()
    if twin:
        twin.install(p.decode)
    p.da.set_plan([("B", "t1", 0, 8)])
    old_slots = p.da.alloc(8)
    p.da.clear_plan()
    with p.da.releasing("t1", "B"):  # SGLang's release of B (retracted): its frees present B's holds
        p.da.free(old_slots)
        p.da.free(DeviceOnlyTensor(old_slots.tolist()))
    assert p.da.pending_frees() >= 1  # the device double free has not reached the pool
    expected = p.pkv.read(p.prefill_request("B", "t1", SIZE, 5.0))
    try:
        slots = p.decode.reserve("B", "t1", SIZE, PEER)
    except KvShieldError:  # strict mode: the refused double free surfaces first; then the reservation runs
        slots = p.decode.reserve("B", "t1", SIZE, PEER)
    # NOTE: the whole pool once B's release reached it; a reservation that ran ahead of it finds B's pages still held
    assert slots is not None, f"the reservation ran ahead of the deferred frees: no room ({p.decode.last_shortfall()})"
    assert set((old_slots // PAGE).tolist()) <= set((slots // PAGE).tolist()), "B must get its old pages (the premise)"
    p.prefill.copy_to(p.decode, "B")
    try:
        p.da.end_step()
    except KvShieldError:
        pass
    p.prefill.mark_sent("B", SIZE)
    view = client_view(p, lambda: slots, lambda: p.decode.commit("B", p.prefill.sent_tokens("B")))
    assert view[0] == 200, f"a deferred double free released a live page: B's transfer was refused {view[:2]}"
    assert_safe(view, expected)
    rid = p.da.request_id("B")
    assert all(p.da.page_owner(int(s) // PAGE) == ("t1", rid) for s in slots[::PAGE]), "a deferred double free released a live page"
    assert p.da.rejected_frees() == len(old_slots) // PAGE  # the double free's pages, refused once each


def test_deferred_frees_reach_the_pool_before_a_reservation(jvm, monkeypatch):
    _deferred_double_free_then_reserve(monkeypatch)


def test_twin_reserving_ahead_of_deferred_frees_loses_pages(jvm, monkeypatch):
    with pytest.raises(AssertionError, match="live page|ran ahead of the deferred frees"):
        _deferred_double_free_then_reserve(monkeypatch, MovesPagesAheadOfDeferredFrees)


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


# ---------------------------------------------------------------- prefill and decode pools of different layouts

def _layout_transfer(prefill_kv, decode_kv, transport=None):
    """Prefill (pool ``prefill_kv``) computes request r of 4 tokens (one page) (buffer j of token i holds 100 * (j + 1) + i) and
    publishes it sent; the in-process transport (``copy_to``, or ``transport``) carries it to the decode pool
    (``decode_kv``, whose reserved slots hold -9: an earlier request's bytes) and decode commits on the coverage
    prefill published (a copy's failure is the transport's: the decode side learns only the coverage). Returns
    (committed, what the copy raised, the decode slots' bytes per buffer, prefill's per buffer)."""
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import HandoffError
    from kvshield_sglang.handoff import Handoff

    def side(kv):
        a = PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", kv, False, kvshield_settings={
            "level": "ZERO", "strict": True, "advertisedContextTokens": 32})
        return a, Handoff(a)

    (pa, prefill), (_, decode) = side(prefill_kv), side(decode_kv)
    prefill.handshake(PEER, decode.effective_limit())
    decode.handshake(PEER, prefill.effective_limit())
    pa.set_plan([("r", "t1", 0, PAGE)])
    pslots = pa.alloc(PAGE)
    pa.clear_plan()
    pbufs = list(prefill_kv.kv_buffer) if hasattr(prefill_kv, "kv_buffer") else prefill_kv.buffers()
    dbufs = list(decode_kv.kv_buffer) if hasattr(decode_kv, "kv_buffer") else decode_kv.buffers()
    for j, b in enumerate(pbufs):
        b[pslots] = (100.0 * (j + 1) + torch.arange(PAGE, dtype=torch.float32))[:, None, None]
    prefill.begin("r", "t1", PAGE, pslots, PEER)
    dslots = decode.reserve("r", "t1", PAGE, PEER)
    for b in dbufs:
        b[dslots] = -9.0
    copy_error = None
    try:
        if transport is None:
            prefill.copy_to(decode, "r")
        else:
            transport(decode, dslots, pbufs, pslots, dbufs)
    except HandoffError as e:
        copy_error = str(e)
    prefill.mark_sent("r", PAGE)
    try:
        committed = decode.commit("r", prefill.sent_tokens("r"))
    except HandoffError:
        committed = False
    return committed, copy_error, [b[dslots].clone() for b in dbufs], [b[pslots].clone() for b in pbufs]


def _layout_blind_copy(decode, dslots, pbufs, pslots, dbufs):
    """Planted bug: the in-process copy as it was, buffer b of each page to buffer b whatever either pool's layout,
    the pages then reported written."""
    for s, d in zip(pbufs, dbufs):
        if s[pslots].numel() == d[dslots].numel():
            d[dslots] = s[pslots].reshape(d[dslots].shape)
    for i in range(len(decode.reserved_pages("r"))):
        decode.record_written("r", i, 0, PAGE)


LAYOUTS = {
    # prefill 3 layers, decode 2: buffer 2 (prefill's layer 2 K) would land in decode's layer 0 V
    "layers": (lambda: MHAPool(SIZE, PAGE, layers=3), lambda: MHAPool(SIZE, PAGE, layers=2), [0, 1, 3, 4],
               "6 KV buffers, decode 4"),
    # an MHA prefill and an MLA decode of the same bytes per token: K and V would land as latent KV
    "kinds": (lambda: MHAPool(SIZE, PAGE, layers=2), lambda: MLAPool(SIZE, PAGE, layers=4, kv_lora_rank=2,
                                                                     qk_rope_head_dim=2), None, "K) of 16 bytes per token, decode buffer 0"),
}


def _assert_layout_safe(committed, dbytes, pbytes, same_role):
    """The oracle: a commit only if each decode buffer holds the prefill bytes of its own layer and kind."""
    if committed:
        assert same_role is not None, f"decode committed KV from a pool of another kind: {[b[0, 0, 0].item() for b in dbytes]}"
        for d, j in zip(dbytes, same_role):
            assert torch.equal(d.reshape(-1), pbytes[j].reshape(-1)), (
                f"decode committed prefill buffer bytes {d.reshape(-1)[:2].tolist()} where its layer's "
                f"{pbytes[j].reshape(-1)[:2].tolist()} belong")


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_decode_pool_of_another_layout_is_refused_before_any_byte_moves(jvm, layout):
    """README: the in-process transport lands KV "through the claims"; ``copy_to`` copies buffer b of page i to
    buffer b of page i, which is the same KV only between pools of one token layout. A prefill pool with more
    layers wrote its extra layer's K into decode's V buffers before failing on the missing buffer, and the
    commit then passed every page as written (200 over misplaced KV); an MLA decode of the same bytes per token
    took MHA K/V as latent KV. Refused before any byte moves, naming both values."""
    make_prefill, make_decode, same_role, named = LAYOUTS[layout]
    committed, error, dbytes, pbytes = _layout_transfer(make_prefill(), make_decode())
    _assert_layout_safe(committed, dbytes, pbytes, same_role)
    assert not committed and error is not None and "does not match the decode pool's" in error and named in error, error
    assert all(bool((d == -9.0).all()) for d in dbytes), "bytes moved before the refusal"


def test_twin_a_layout_blind_copy_commits_misplaced_kv(jvm):
    make_prefill, make_decode, same_role, _ = LAYOUTS["layers"]
    committed, _, dbytes, pbytes = _layout_transfer(make_prefill(), make_decode(), _layout_blind_copy)
    with pytest.raises(AssertionError, match="where its layer's"):
        _assert_layout_safe(committed, dbytes, pbytes, same_role)


def test_control_pools_of_one_layout_copy_and_commit(jvm):
    committed, error, dbytes, pbytes = _layout_transfer(MHAPool(SIZE, PAGE, layers=2), MHAPool(SIZE, PAGE, layers=2))
    assert committed and error is None
    _assert_layout_safe(committed, dbytes, pbytes, [0, 1, 2, 3])
