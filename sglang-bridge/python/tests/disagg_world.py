"""Handoff scenarios through the hooked SGLang disaggregation queues of the stand-in (tests/stub_sglang),
run in a subprocess by ``test_disagg_hooks.py``: a prefill pool and a decode pool, SGLang's prefill
bootstrap queue, decode prealloc and transfer queues and its fake transport; the wire is an in-process
copy through both sides' claims (``Handoff.copy_to``), or raw tensor writes for a transport that
writes decode memory itself.

Every scenario's oracle reads bytes back from the decode pool; its planted-bug twins (below, test
code only) must make it fail. ``main`` prints one ``RESULTS <json>`` line: scenario → [pass|fail, message].
"""

import contextlib
import ctypes
import os
import time
import types

import torch

import scenarios
from fakes import MHAPool
from sglang.srt.disaggregation import decode as dmod
from sglang.srt.disaggregation.base.conn import BaseKVReceiver, KVArgs, KVPoll
from sglang.srt.disaggregation.fake import FakeKVManager, FakeKVReceiver, FakeKVSender
from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver
from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue, SchedulerDisaggregationPrefillMixin
from sglang.srt.disaggregation.utils import (FAKE_BOOTSTRAP_HOST, FINISH_ABORT, DisaggregationMode, KVClassType,
                                             MetadataBuffers, ReqToMetadataIdxAllocator, TransferBackend)
from sglang.srt.mem_cache import common

from kvshield_sglang import disagg, transport
from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
from kvshield_sglang.errors import HandoffError
from kvshield_sglang.handoff import Handoff

SIZE, PAGE = 32, 4
PREFILL_PEER = 1  # the decode pool, as the prefill side names it
HOST = "10.0.0.1"


class MHAPool(MHAPool):
    """The pool with the registration SGLang's transports read (``get_contiguous_buf_infos``: per K/V
    buffer its address, bytes and page bytes)."""

    def __init__(self, size, page_size, layers=2):
        super().__init__(size, page_size, layers=layers)
        self.page_size = page_size

    def get_contiguous_buf_infos(self):
        bufs = self.buffers()
        return ([b.data_ptr() for b in bufs], [b.numel() * b.element_size() for b in bufs],
                [b[0].numel() * b.element_size() * self.page_size for b in bufs])


def _alloc(limit, level="ZERO"):
    kv = MHAPool(SIZE, PAGE, layers=2)
    a = PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", kv, False, kvshield_settings={
        "level": level, "strict": True, "advertisedContextTokens": limit})
    return a, kv




class Req:
    """The fields of SGLang's Req the disaggregation queues read."""

    def __init__(self, rid, n, tenant, room, rows):
        self.rid, self.origin_input_ids, self.output_ids = rid, list(range(n)), []
        self.fill_ids, self.start_send_idx, self.metadata_buffer_index = self.origin_input_ids, 0, -1
        self.finished_reason, self.return_logprob = None, False
        self.bootstrap_host, self.bootstrap_port, self.bootstrap_room = HOST, 8998, room
        self.kvshield_tenant, self.req_pool_idx, self.kv_committed_len = tenant, None, 0
        self._rows = rows

    def finished(self):
        return self.finished_reason is not None

    @property
    def slots(self):  # the stand-in's release_kv_cache frees these (SGLang: the request's req_to_token row)
        return self._rows.req_to_token[self.req_pool_idx, : self.kv_committed_len].to(torch.int64)


class _ServerArgs:
    disaggregation_transfer_backend = "fake"
    disaggregation_decode_enable_radix_cache = False


class _Batch:
    reqs = ()


class Scheduler:
    def __init__(self, allocator):
        self.token_to_kv_pool_allocator, self.streamed = allocator, []
        self.server_args, self.running_batch = _ServerArgs(), _Batch()

    def stream_output(self, reqs, return_logprob):
        self.streamed.extend(reqs)


class TreeCache:
    def __init__(self, allocator):
        self.token_to_kv_pool_allocator = allocator


class World:
    """Prefill and decode servers in one process, joined by SGLang's fake transport (or ``backend``)."""

    _rooms = iter(range(1000, 10**6))

    def __init__(self, tag, decode_handoff=None, prefill_limit=32, decode_limit=32, backend=TransferBackend.FAKE,
                 level="ZERO", metadata_rows=8):
        self.tag = tag
        self.pa, self.pkv = _alloc(prefill_limit, level)
        self.da, self.dkv = _alloc(decode_limit, level)
        self.prefill, self.decode = Handoff(self.pa), Handoff(self.da)
        self.da.kvshield_handoff = decode_handoff(self.decode) if decode_handoff else self.decode
        self.pq = PrefillBootstrapQueue(Scheduler(self.pa))
        self.dsched = Scheduler(self.da)
        self.rows = dmod.DecodeReqToTokenPool(8, 64, "cpu", False, 8)
        self.tree = TreeCache(self.da)
        self.dmeta, self.dmeta_rows = MetadataBuffers(metadata_rows, 4, torch.float32), ReqToMetadataIdxAllocator(metadata_rows)
        meta = {"req_to_metadata_buffer_idx_allocator": self.dmeta_rows, "metadata_buffers": self.dmeta}
        self.tq = dmod.DecodeTransferQueue(self.dsched, self.tree, **meta)
        self.pre = dmod.DecodePreallocQueue(self.rows, self.da, self.dsched, self.tq, self.tree, SIZE, 0, backend, **meta)
        args = KVArgs()
        args.page_size = PAGE
        self.sender_mgr = FakeKVManager(args, DisaggregationMode.PREFILL, None)
        self.senders, self.prefill_slots = {}, {}

    def req(self, name, n, tenant="t1"):
        """The same request as prefill and decode each see it (one rid, one bootstrap room)."""
        rid, room = f"{self.tag}-{name}", next(self._rooms)
        return Req(rid, n, tenant, room, self.rows), Req(rid, n, tenant, room, self.rows)

    def prefill_request(self, req, value, begin=True):
        """The prefill server admits ``req``, computes its KV (token i holds value + i) and starts sending."""
        self.pq.add(req, 1)
        if req.finished():
            return None
        n = len(req.origin_input_ids)
        self.pa.set_plan([(req.rid, req.kvshield_tenant, 0, n)])
        slots = self.pa.alloc(-(-n // PAGE) * PAGE)
        self.pa.clear_plan()
        for b in self.pkv.buffers():
            b[slots[:n]] = (value + torch.arange(n, dtype=torch.float32))[:, None, None]
        if begin:
            self.prefill.ensure_peer(PREFILL_PEER, self.decode.effective_limit())
            self.prefill.begin(req.rid, req.kvshield_tenant, n, slots, PREFILL_PEER)
        self.senders[req.rid] = FakeKVSender(self.sender_mgr, f"{HOST}:8998", req.bootstrap_room)
        self.prefill_slots[req.rid] = slots[:n]
        return slots[:n]

    def decode_request(self, req):
        """The decode server takes ``req``: prealloc queue, then (if preallocated) the transfer queue."""
        self.pre.add(req)
        preallocated, failed = self.pre.pop_preallocated()
        self.tq.extend(preallocated)
        return preallocated, failed

    def send(self, rid, pages, land=None):
        """Prefill's sender sends its first ``pages`` pages; the wire lands ``land`` of them (default: all sent)."""
        page_ids = self.prefill_slots[rid][::PAGE] // PAGE
        self.senders[rid].send(page_ids[:pages].to(torch.int32))
        self.prefill.copy_to(self.decode, rid, 0, pages if land is None else land)

    def decode_slots(self, req):
        return self.rows.req_to_token[req.req_pool_idx, : len(req.origin_input_ids)].to(torch.int64)

    def client_view(self, req, done):
        """What the client gets: (status, finish, bytes decode read)."""
        if req in done:
            return 200, "length", self.dkv.read(self.decode_slots(req))
        reason = req.finished_reason
        assert isinstance(reason, FINISH_ABORT), f"request {req.rid} neither decoded nor aborted: {reason!r}"
        return int(reason.status_code), "abort", None


def assert_safe(view, expected):
    """The oracle: a 200 "length" finish only over exactly the bytes prefill computed; otherwise an abort with 4xx/5xx."""
    status, finish, seen = view
    if status == 200:
        assert finish == "length"
        assert torch.equal(seen, expected), "decode served bytes prefill never sent"
    else:
        assert finish == "abort" and status >= 400, view[:2]


# ---------------------------------------------------------------- planted bugs (test code only)

class _Wrapper:
    def __init__(self, real):
        self.real = real

    def __getattr__(self, name):
        return getattr(self.real, name)


class AcceptsPartialCoverage(_Wrapper):
    """Planted bug: the decode side commits whatever the sender published (the incident's "length"/200)."""

    def commit(self, rid, covered_tokens):
        return True


class FreesOnTimeout(_Wrapper):
    """Planted bug: an overdue transfer's pages are freed (abort, then a fake acknowledgement)."""

    def expire(self, rid):
        self.real.abort(rid)
        self.real.acknowledge(rid)


class AllocatesBeforeRefusing(_Wrapper):
    """Planted bug: the pages are taken before the claim-slot check and kept when it refuses."""

    def reserve(self, rid, tenant, seq_len, peer):
        try:
            return self.real.reserve(rid, tenant, seq_len, peer)
        except HandoffError:
            alloc = self.real.allocator
            alloc.set_plan([(rid, tenant, 0, seq_len)])
            alloc.alloc(-(-seq_len // PAGE) * PAGE)
            alloc.clear_plan()
            raise


class SkipsLimitCheck(_Wrapper):
    """Planted bug: the peer is recorded with our own limit, never compared."""

    def ensure_peer(self, peer, peer_limit_tokens):
        self.real.handshake(peer, self.real.effective_limit())


# ---------------------------------------------------------------- scenarios

def full_transfer():
    w = World("full")
    p, d = w.req("r", 10)
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    before = w.da.available_size()
    preallocated, _ = w.decode_request(d)
    assert [x.req for x in preallocated] == [d]
    assert torch.equal(w.decode.reserved_pages(d.rid), torch.unique(w.decode_slots(d) // PAGE)), "receiver got other pages"
    w.send(d.rid, 3)
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    assert view[0] == 200, view[:2]
    assert_safe(view, expected)
    assert w.decode.outcome(d.rid) == "COMMITTED" and w.decode.unacknowledged() == 0
    # The committed pages are the request's own: its first decoded token goes into its last, partial page.
    dslots = w.decode_slots(d)
    w.da.set_plan([(d.rid, d.kvshield_tenant, 10, 11)])
    nxt = w.da.alloc_decode(torch.tensor([11]), torch.tensor([11]), dslots[-1:])
    w.da.clear_plan()
    assert nxt.tolist() == [int(dslots[-1]) + 1], (nxt, dslots)
    w.rows.write((d.req_pool_idx, slice(10, 11)), nxt)
    d.kv_committed_len = 11
    common.release_kv_cache(d, w.tree)  # the request finishes: SGLang releases its KV, then its row
    w.rows.free(d)
    assert not w.decode.has_reservation(d.rid)
    w.da.end_step()
    assert w.da.available_size() == before, (w.da.available_size(), before)


def oversized(twin=None):
    w = World("oversized", decode_handoff=twin, prefill_limit=16, decode_limit=16)  # kvshield's limit, under SGLang's
    limit = w.decode.effective_limit()
    before = w.da.available_size()
    _, big = w.req("big", limit + 1)
    preallocated, failed = w.decode_request(big)
    assert preallocated == [] and [x.req for x in failed] == [big], (limit, preallocated, failed, big.finished_reason)
    assert w.client_view(big, [])[:2] == (400, "abort"), big.finished_reason.to_json()
    assert str(limit + 1) in big.finished_reason.message, big.finished_reason.message
    assert w.da.available_size() == before and not w.decode.has_reservation(big.rid)
    assert all(torch.count_nonzero(b).item() == 0 for b in w.dkv.buffers()), "decode holds bytes of a rejected request"
    # The incident: prefill rejects the prompt and shrinks it to a one-token placeholder; decode asks for the full prompt.
    p, d = w.req("ph", limit)
    placeholder = Req(p.rid, 1, p.kvshield_tenant, p.bootstrap_room, w.rows)
    placeholder.finished_reason = FINISH_ABORT("prompt too long", 400)
    assert w.prefill_request(placeholder, 5.0) is None and w.pq.queue == []
    assert placeholder.finished_reason.status_code == 400
    # An SGLang without the prefill check hands the placeholder off anyway: one token of KV is sent.
    placeholder.finished_reason = None
    w.pq.queue.append(placeholder)
    n = 1
    w.pa.set_plan([(p.rid, p.kvshield_tenant, 0, n)])
    src = w.pa.alloc(PAGE)
    w.pa.clear_plan()
    for b in w.pkv.buffers():
        b[src[:n]] = 5.0
    w.prefill.ensure_peer(PREFILL_PEER, w.decode.effective_limit())
    w.prefill.begin(p.rid, p.kvshield_tenant, n, src, PREFILL_PEER)
    w.senders[p.rid] = FakeKVSender(w.sender_mgr, f"{HOST}:8998", p.bootstrap_room)
    w.prefill_slots[p.rid] = src[:n]
    preallocated, _ = w.decode_request(d)
    assert [x.req for x in preallocated] == [d]
    dslots = w.decode_slots(d)
    for b in w.dkv.buffers():  # stale KV of an earlier request on the decode pool's memory
        b[dslots] = -9.0
    expected = torch.cat([w.pkv.read(src[:n]), torch.zeros(4, limit - n, 1, 4)], dim=1)
    w.send(d.rid, 1)
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    assert_safe(view, expected)
    assert view[:2] == (500, "abort") and "covered 4 of" in d.finished_reason.message, view[:2]


def one_page_of_many(sent_pages, message, twin=None):
    w = World(f"one-of-many-{sent_pages}", decode_handoff=twin)
    p, d = w.req("r", 16)
    expected = w.pkv.read(w.prefill_request(p, 10.0))
    w.decode_request(d)
    w.send(d.rid, sent_pages, land=1)  # only the first of four pages lands
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    assert_safe(view, expected)
    assert view[:2] == (500, "abort"), view[:2]
    assert message in d.finished_reason.message and d in w.dsched.streamed, d.finished_reason.message
    assert not w.decode.has_reservation(d.rid) and w.decode.unacknowledged() == 0  # refused, then acknowledged


def late_write(twin=False):
    """The client aborts A mid-transfer; A's pages go to request B of another tenant; A's transfer writes late."""
    w = World(f"late-{twin}")
    p, a = w.req("A", 8)
    src = w.prefill_request(p, 50.0)
    w.decode_request(a)
    a_slots = w.decode_slots(a)
    w.tq.queue[0].kv_receiver.abort()  # SGLang's abort_request fails the receiver
    assert w.tq.pop_transferred() == [] and w.client_view(a, [])[:2] == (500, "abort")
    # The fake transport concluded, so the hooks acknowledged: A's record is gone, its pages go back once scrubbed.
    assert w.decode.unacknowledged() == 0 and not w.decode.has_reservation(a.rid)
    w.da.end_step()
    w.da.set_plan([(f"{w.tag}-B", "t2", 0, SIZE)])  # B takes every page, so A's pages too
    b_slots = w.da.alloc(SIZE)
    w.da.clear_plan()
    assert set(a_slots.tolist()) <= set(b_slots.tolist())
    for b in w.dkv.buffers():
        b[b_slots] = 3.0
    expected = w.dkv.read(b_slots).clone()
    if twin:  # planted bug: the transport writes A's KV by the slots it was given, no claim or generation check
        for b_src, b_dst in zip(w.pkv.buffers(), w.dkv.buffers()):
            b_dst[a_slots] = b_src[src]
    else:
        try:
            w.prefill.copy_to(w.decode, a.rid, 0, 2)
            raise AssertionError("A's late write went through after its acknowledgement")
        except HandoffError as e:
            assert "no handoff reservation" in str(e), e
    assert torch.equal(w.dkv.read(b_slots), expected), "A's late write landed in B's pages"


def _live_claims(w):
    return int(w.da._j.pool().snapshot().liveClaims())


def _hog_claims(w, keep):
    """Another transfer on the decode pool (tenant t9, reader claims on its own page) holds every claim slot but ``keep``."""
    import jpype

    rid = f"{w.tag}-hog"
    w.da.set_plan([(rid, "t9", 0, PAGE)])
    page = int(w.da.alloc(PAGE)[0]) // PAGE
    w.da.clear_plan()
    pool = w.da._j.pool()
    owner = jpype.JClass("dev.kvshield.tenant.Owners").request(w.da.request_id(rid))
    reader = jpype.JClass("dev.kvshield.claims.ClaimKind").READER
    tenant, handle = w.da.tenant_id("t9"), w.da._j.handleOf(page)
    for _ in range(int(pool.config().maxClaims()) - _live_claims(w) - keep):
        pool.claim(tenant, owner, handle, reader, 7)


def reserve_refused(twin=None):
    """SGLang's budget admits A (2 pages) then B (1 page); claim slots are left for B only: A fails alone (503,
    streamed, nothing reserved, its row back), B is preallocated in the same step and decodes its exact bytes."""
    w = World(f"refused-{twin is not None}", decode_handoff=twin)
    pa, a = w.req("A", 8)
    pb, b = w.req("B", 4)
    w.prefill_request(pa, 20.0)
    expected_b = w.pkv.read(w.prefill_request(pb, 40.0))
    _hog_claims(w, keep=1)
    pages_before, rows_before, claims_before = w.da.available_size(), w.rows.available_size(), _live_claims(w)
    w.pre.add(a)
    w.pre.add(b)
    preallocated, failed = w.pre.pop_preallocated()
    assert [x.req for x in preallocated] == [b] and [x.req for x in failed] == [a], (preallocated, failed)
    assert w.client_view(a, [])[:2] == (503, "abort"), a.finished_reason.to_json()
    assert "claim slots free" in a.finished_reason.message and w.dsched.streamed.count(a) == 1, a.finished_reason.message
    assert not w.decode.has_reservation(a.rid) and a.req_pool_idx is None and a.kv_committed_len == 0
    assert w.rows.available_size() == rows_before - 1, (w.rows.available_size(), rows_before)  # B's row only
    assert w.da.available_size() == pages_before - PAGE, f"pages leaked: {w.da.available_size()} of {pages_before}"
    assert _live_claims(w) == claims_before + 1, (_live_claims(w), claims_before)  # B's writer claim only
    assert all(torch.count_nonzero(buf).item() == 0 for buf in w.dkv.buffers()), "decode holds bytes of a refused request"
    assert w.pre.pop_preallocated() == ([], []) and w.dsched.streamed.count(a) == 1, "the abort was streamed twice"
    w.tq.extend(preallocated)
    w.send(b.rid, 1)
    view = w.client_view(b, w.tq.pop_transferred())
    assert view[0] == 200, view[:2]
    assert_safe(view, expected_b)


class NicKVReceiver(FakeKVReceiver):
    """A transport whose NIC writes decode memory itself and whose acknowledgement is lost."""


class NicTransport(transport.FakeTransport):
    name = "nic"

    def acknowledged(self, receiver):
        return False


def lost_ack(twin=None):
    w = World(f"lost-ack-{twin is not None}", decode_handoff=twin, backend="nic")
    p, a = w.req("A", 8)
    src = w.prefill_request(p, 70.0)
    w.decode_request(a)
    a_slots = w.decode_slots(a)
    for b_src, b_dst in zip(w.pkv.buffers(), w.dkv.buffers()):
        b_dst[a_slots[:4]] = b_src[src[:4]]
    w.decode.record_written(a.rid, 0, 0, 4)
    w.tq.queue[0].kv_receiver.abort()  # the transfer times out on SGLang's side: Failed
    assert w.tq.pop_transferred() == [], "a failed transfer decoded"
    assert w.client_view(a, [])[:2] == (500, "abort"), a.finished_reason.to_json()
    w.pre.pop_preallocated()  # next step: no acknowledgement past the deadline (0 s here) → expire
    w.da.end_step()
    w.da.set_plan([(f"{w.tag}-B", "t2", 0, 8)])
    b_slots = w.da.alloc(8)
    w.da.clear_plan()
    for b in w.dkv.buffers():
        b[b_slots] = 3.0
    expected = w.dkv.read(b_slots).clone()
    for b_src, b_dst in zip(w.pkv.buffers(), w.dkv.buffers()):  # the NIC finishes A's transfer late
        b_dst[a_slots] = b_src[src]
    assert torch.equal(w.dkv.read(b_slots), expected), "A's late write landed in B's pages"
    # A was aborted first; the expiry fenced its claims and kept its record (the transfer may still drain).
    assert w.decode.outcome(a.rid) == "ABORTED" and w.decode.unacknowledged() == 1, w.decode.outcome(a.rid)
    assert len(w.decode.alarms()) == 1 and "never acknowledged" in w.decode.alarms()[0], w.decode.alarms()
    # Back-pressure: A's two pages stay out of circulation; a request needing them waits in the prealloc queue.
    assert w.da.available_size() == SIZE - 8 - 8, w.da.available_size()
    _, c = w.req("C", SIZE - 8, "t3")
    preallocated, failed = w.decode_request(c)
    assert preallocated == [] and failed == [] and [x.req for x in w.pre.queue] == [c], (preallocated, failed)


def ack_deadline():
    """Given up, unacknowledged: nothing happens before the deadline; the first sweep past it expires."""
    w = World("deadline", backend="nic")
    p, a = w.req("A", 8)
    w.prefill_request(p, 70.0)
    w.decode_request(a)
    os.environ[disagg.ACK_TIMEOUT] = "30"
    try:
        w.tq.queue[0].kv_receiver.abort()
        w.tq.pop_transferred()
        start = time.monotonic()
        disagg.sweep(w.decode, now=start + 29)
        assert w.decode.alarms() == [] and w.decode.unacknowledged() == 1, w.decode.alarms()
        disagg.sweep(w.decode, now=start + 31)
        assert len(w.decode.alarms()) == 1 and w.decode.unacknowledged() == 1, w.decode.alarms()
    finally:
        os.environ[disagg.ACK_TIMEOUT] = "0"


def limit_mismatch(twin=None):
    w = World(f"mismatch-{twin is not None}", decode_handoff=twin, prefill_limit=32, decode_limit=16)
    mine, theirs = w.decode.effective_limit(), w.prefill.effective_limit()
    assert mine != theirs
    before = w.da.available_size()
    p, d = w.req("r", 8)
    w.prefill_request(p, 1.0, begin=False)
    preallocated, failed = w.decode_request(d)
    assert preallocated == [] and [x.req for x in failed] == [d], "a peer with another limit was accepted"
    assert d.finished_reason.status_code == 503 and str(mine) in d.finished_reason.message
    assert str(theirs) in d.finished_reason.message
    assert w.da.available_size() == before and not w.decode.has_reservation(d.rid)


class OpaqueKVReceiver(BaseKVReceiver):
    """A transport kvshield knows nothing about (no adapter, no metadata copy)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.conclude_state = None

    def init(self, prefill_dp_rank):
        pass

    def poll(self):
        return KVPoll.WaitingForInput

    def clear(self):
        pass


def unsupported_transport():
    w = World("unsupported", backend="opaque")
    p, d = w.req("r", 8)
    w.prefill_request(p, 1.0)
    preallocated, failed = w.decode_request(d)
    assert preallocated == [] and [x.req for x in failed] == [d], (preallocated, failed)
    msg = d.finished_reason.message
    assert d.finished_reason.status_code == 500 and "disagg_world.OpaqueKVReceiver" in msg, msg
    assert "register" in msg, msg
    assert not w.decode.has_reservation(d.rid)


# ---------------------------------------------------------------- Mooncake: coverage in the metadata transfer

class PrefillScheduler(SchedulerDisaggregationPrefillMixin):
    def __init__(self, rows, allocator, metadata_buffers):
        self.req_to_token_pool, self.token_to_kv_pool_allocator, self.disagg_metadata_buffers = rows, allocator, metadata_buffers


class MooncakeWorld(World):
    """Prefill and decode servers joined by (the stand-in of) Mooncake: KV pages and metadata rows are
    raw copies between the two pools' registered buffers; both sides' metadata buffers carry kvshield's row."""

    def __init__(self, tag, metadata_rows=8, **kw):
        super().__init__(tag, backend=TransferBackend.MOONCAKE, metadata_rows=metadata_rows, **kw)
        self.pmeta = MetadataBuffers(8, 4, torch.float32)  # the prefill side frees none (its inflight queue is left out)
        self.pq = PrefillBootstrapQueue(Scheduler(self.pa), self.pkv, ReqToMetadataIdxAllocator(8), self.pmeta,
                                        transfer_backend=TransferBackend.MOONCAKE)
        self.prows = dmod.DecodeReqToTokenPool(8, 64, "cpu", False, 8)
        self.psched = PrefillScheduler(self.prows, self.pa, self.pmeta)

    def prefill_request(self, req, value):
        """The prefill server admits ``req``, computes its KV (token i holds value + i) and bootstraps it
        (metadata row, sender init); its first output token is 7."""
        self.pq.add(req, 1)
        if req.finished():
            return None
        n = len(req.origin_input_ids)
        req._rows = self.prows
        self.pa.set_plan([(req.rid, req.kvshield_tenant, 0, n)])
        slots = self.pa.alloc(-(-n // PAGE) * PAGE)
        self.pa.clear_plan()
        for b in self.pkv.buffers():
            b[slots[:n]] = (value + torch.arange(n, dtype=torch.float32))[:, None, None]
        self.prows.alloc([req])
        self.prows.write((req.req_pool_idx, slice(0, n)), slots[:n].to(torch.int32))
        req.output_ids = [7]
        assert self.pq.pop_bootstrapped() == [req]
        return slots[:n]

    def send_chunk(self, req, end_idx=None, last=False):
        self.psched.send_kv_chunk(req, last_chunk=last, end_idx=end_idx)


def meta_full():
    w = MooncakeWorld("meta-full")
    p, d = w.req("r", 14)
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    preallocated, _ = w.decode_request(d)
    assert [x.req for x in preallocated] == [d]
    w.send_chunk(p, end_idx=8)
    assert w.tq.pop_transferred() == [], "decoded before the last chunk"
    w.send_chunk(p, last=True)
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    assert view[0] == 200, view[:2]
    assert_safe(view, expected)
    assert d.output_ids == [7], f"the metadata transfer did not land: {d.output_ids}"
    assert w.decode.outcome(d.rid) == "COMMITTED" and w.decode.unacknowledged() == 0
    common.release_kv_cache(d, w.tree)
    w.rows.free(d)
    assert not w.decode.has_reservation(d.rid)


def _placeholder(w, p, value):
    """Prefill shrank ``p`` to a one-token placeholder without marking it finished: it is bootstrapped."""
    ph = Req(p.rid, 1, p.kvshield_tenant, p.bootstrap_room, w.prows)
    ph.bootstrap_host = p.bootstrap_host
    return ph, w.prefill_request(ph, value)


def meta_incident(twin=None):
    """The incident over Mooncake: prefill sends one page of a placeholder, the transport reports Success."""
    w = MooncakeWorld(f"meta-incident-{twin is not None}", decode_handoff=twin, prefill_limit=16, decode_limit=16)
    p, d = w.req("r", 16)
    ph, src = _placeholder(w, p, 5.0)
    w.decode_request(d)
    dslots = w.decode_slots(d)
    for b in w.dkv.buffers():  # stale KV of an earlier request on the decode pool's memory
        b[dslots] = -9.0
    w.send_chunk(ph, last=True)
    assert w.tq.queue[0].kv_receiver.poll() == KVPoll.Success
    expected = torch.cat([w.pkv.read(src), torch.zeros(4, 15, 1, 4)], dim=1)
    view = w.client_view(d, w.tq.pop_transferred())
    assert_safe(view, expected)
    assert view[:2] == (500, "abort") and "covered 1 of 16" in d.finished_reason.message, d.finished_reason.message


def _prompt_kv(value, n):
    """The KV prefill computes for a prompt of ``n`` tokens (token i holds value + i), as ``_read`` returns it."""
    return (value + torch.arange(n, dtype=torch.float32))[None, :, None, None].expand(4, n, 1, 4)


def _old_send_aux(self, prefill_aux_index, dst_kv_args, dst_aux_index):
    """An older Mooncake's send_aux: only the first metadata buffer is copied."""
    length = self.kv_args.aux_item_lens[0]
    ctypes.memmove(dst_kv_args.aux_data_ptrs[0] + length * dst_aux_index,
                   self.kv_args.aux_data_ptrs[0] + length * prefill_aux_index, length)


@contextlib.contextmanager
def _mooncake_adapter(adapter):
    """Mooncake's receivers answered by ``adapter`` (a planted bug) inside, by kvshield's own outside."""
    saved = transport.adapter_for(MooncakeKVReceiver.__new__(MooncakeKVReceiver))
    if adapter is not None:
        transport.register(MooncakeKVReceiver, adapter)
    try:
        yield
    finally:
        transport.register(MooncakeKVReceiver, saved)


def meta_stale_row(adapter=None):
    """A client reuses a bootstrap room; the second request's row never arrives (a Mooncake that copies only
    the first metadata buffer) while its transport reports Success: the first request's row at the same
    metadata index must not be read as the second's."""
    w = MooncakeWorld(f"meta-stale-{adapter is not None}", metadata_rows=1)
    with _mooncake_adapter(adapter):
        p1, d1 = w.req("r1", 8)
        w.prefill_request(p1, 10.0)
        w.decode_request(d1)
        w.send_chunk(p1, last=True)
        assert w.client_view(d1, w.tq.pop_transferred())[0] == 200
        common.release_kv_cache(d1, w.tree)
        w.rows.free(d1)
        w.da.end_step()
        p2, d2 = w.req("r2", 8)
        d2.bootstrap_room = p2.bootstrap_room = d1.bootstrap_room
        w.pq.kv_manager.send_aux = types.MethodType(_old_send_aux, w.pq.kv_manager)
        ph, _ = _placeholder(w, p2, 20.0)
        expected = _prompt_kv(20.0, 8)
        w.decode_request(d2)
        w.send_chunk(ph, last=True)
        view = w.client_view(d2, w.tq.pop_transferred())
        assert_safe(view, expected)
        assert view[:2] == (500, "abort") and "no kvshield coverage row arrived" in d2.finished_reason.message, view[:2]


def meta_late_write(adapter=None):
    """A's transfer is aborted on decode after 3 of 4 pages; its metadata row goes to B; A's prefill then sends
    its last chunk, whose metadata copy lands in B's row after B's own (one page of a placeholder)."""
    w = MooncakeWorld(f"meta-late-{adapter is not None}", metadata_rows=1)
    with _mooncake_adapter(adapter):
        pa, a = w.req("A", 16)
        w.prefill_request(pa, 30.0)
        w.decode_request(a)
        w.send_chunk(pa, end_idx=12)
        w.tq.queue[0].kv_receiver.abort()
        assert w.tq.pop_transferred() == [] and a.finished_reason.status_code == 500
        pb, b = w.req("B", 16)
        ph, _ = _placeholder(w, pb, 40.0)
        w.decode_request(b)
        bslots = w.decode_slots(b)
        for buf in w.dkv.buffers():
            buf[bslots] = -9.0
        w.send_chunk(ph, last=True)
        w.send_chunk(pa, last=True)  # A's late last chunk: KV into A's (quarantined) pages, its row into B's
        expected = _prompt_kv(40.0, 16)
        view = w.client_view(b, w.tq.pop_transferred())
        assert_safe(view, expected)
        assert view[:2] == (500, "abort") and "belongs to bootstrap room" in b.finished_reason.message, view[:2]


def meta_limit_mismatch(twin=None):
    w = MooncakeWorld(f"meta-mismatch-{twin is not None}", decode_handoff=twin, prefill_limit=32, decode_limit=16)
    mine, theirs = w.decode.effective_limit(), w.prefill.effective_limit()
    assert mine != theirs
    p, d = w.req("r", 8)
    w.prefill_request(p, 1.0)
    w.decode_request(d)
    w.send_chunk(p, last=True)
    done = w.tq.pop_transferred()
    assert done == [] and d.finished_reason is not None, "a peer with another limit was accepted"
    msg = d.finished_reason.message
    assert d.finished_reason.status_code == 503 and str(mine) in msg and str(theirs) in msg, msg
    assert not w.decode.has_reservation(d.rid) or w.decode.outcome(d.rid) != "COMMITTED"


class SkipsClearingTheRow(transport.MetadataTransport):
    """Planted bug: the row a request's metadata index names is not cleared when the request is preallocated."""

    def bind(self, receiver, req, metadata_buffers):
        send_metadata = receiver.send_metadata
        super().bind(receiver, req, metadata_buffers)
        state = receiver._kvshield_row

        def keeps_row(kv_indices, aux_index=None, *a, **k):
            state.index = int(aux_index)
            return send_metadata(kv_indices, aux_index, *a, **k)

        receiver.send_metadata = keeps_row


class IgnoresTheRoom(transport.MetadataTransport):
    """Planted bug: the row is read without comparing its bootstrap room with the request's."""

    def row(self, receiver, rid):
        state = receiver._kvshield_row
        if state.index is not None:
            state.room = int(state.rows[state.index, 1])
        return super().row(receiver, rid)


# ---------------------------------------------------------------- SGLang's no-transfer requests

class AdmitsUnderNone(_Wrapper):
    """Planted bug: a no-transfer request is admitted whatever the protection level."""

    def admit_no_transfer(self, rid, tenant):
        self.real.no_transfer[rid] = tenant
        self.real.no_transfer_admitted += 1


def no_transfer(level, twin=None):
    """A warmup request (SGLang's fake bootstrap host) reaches a decode server whose prefill runs elsewhere,
    on pages that just held another tenant's KV: under a scrubbing level it decodes over zeros (200, as
    SGLang's start-up needs); under NONE it is refused, since those pages keep their bytes."""
    w = World(f"no-transfer-{level}-{twin is not None}", decode_handoff=twin, backend=TransferBackend.MOONCAKE, level=level)
    other = f"{w.tag}-other"
    w.da.set_plan([(other, "t2", 0, SIZE)])
    stale = w.da.alloc(SIZE)
    w.da.clear_plan()
    for b in w.dkv.buffers():
        b[stale] = 3.0
    with w.da.releasing("t2", other):
        w.da.free(stale)
    w.da.end_step()
    _, d = w.req("warmup", 8)
    d.bootstrap_host = FAKE_BOOTSTRAP_HOST
    preallocated, failed = w.decode_request(d)
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    if view[0] == 200:
        assert not torch.any(view[2] == 3.0), "a no-transfer request read another request's bytes"
        assert torch.count_nonzero(view[2]) == 0, view[2]
        assert w.decode.no_transfer_admitted == 1 and not w.decode.has_reservation(d.rid)
        assert w.decode.no_transfer_served == 1 and w.decode.no_transfer == {}
        common.release_kv_cache(d, w.tree)
        w.rows.free(d)
    else:
        assert level == "NONE", f"a no-transfer request was refused under {level}: {d.finished_reason.message}"
        assert view[:2] == (400, "abort") and "level NONE" in d.finished_reason.message, d.finished_reason.message
        assert [x.req for x in failed] == [d] and w.decode.no_transfer == {}
    return view[0]


def no_transfer_levels(twin=None):
    statuses = {level: no_transfer(level, twin) for level in ("ZERO", "NONE")}
    assert statuses == {"ZERO": 200, "NONE": 400}, statuses


class NeverForgets(transport.LoopbackBoard):
    """Planted bug: the board keeps every room (the decode side's "done with it" is ignored)."""

    def forget(self, room):
        pass


def board_pruned(board=None):
    """A batch of handoffs (committed and finished, refused for coverage, refused at admission, aborted in the
    transfer queue, given up on and expired): none of their rooms is left on the fake transport's board while
    their senders are still alive; a room whose decode never came leaves with its sender."""
    import gc

    saved = transport.LOOPBACK
    if board is not None:
        transport.LOOPBACK = board()
    try:
        w, nic = World(f"board-{board is not None}"), World(f"board-nic-{board is not None}", backend="nic")
        rooms = []
        for name, n, pages in (("ok1", 8, 2), ("ok2", 4, 1), ("short", 8, 1)):
            p, d = w.req(name, n)
            rooms.append(d.bootstrap_room)
            w.prefill_request(p, 1.0)
            w.decode_request(d)
            w.send(d.rid, pages)
            for r in w.tq.pop_transferred():  # the committed ones decode and finish
                common.release_kv_cache(r, w.tree)
                w.rows.free(r)
        p, d = w.req("no-tenant", 4)
        rooms.append(d.bootstrap_room)
        w.prefill_request(p, 1.0)
        d.kvshield_tenant = None  # refused at admission
        w.decode_request(d)
        w.pre.pop_preallocated()
        p, d = w.req("aborted", 4)
        rooms.append(d.bootstrap_room)
        w.prefill_request(p, 1.0)
        w.decode_request(d)
        w.send(d.rid, 1, land=0)
        w.tq.queue[0].kv_receiver.abort()
        w.tq.pop_transferred()
        p, d = nic.req("expired", 8)
        rooms.append(d.bootstrap_room)
        nic.prefill_request(p, 1.0)
        nic.decode_request(d)
        nic.send(d.rid, 1)
        nic.tq.queue[0].kv_receiver.abort()
        nic.tq.pop_transferred()
        nic.pre.pop_preallocated()  # the acknowledgement deadline (0 s here) passes: expired
        assert nic.decode.outcome(d.rid) == "ABORTED" and len(nic.decode.alarms()) == 1, nic.decode.alarms()
        assert d.finished_reason.status_code == 500, d.finished_reason.to_json()
        left = set(rooms) & set(transport.LOOPBACK.rooms())
        assert not left and len(w.senders) + len(nic.senders) == len(rooms), f"the board still holds rooms {sorted(left)}"
        p, _ = w.req("orphan", 4)  # prefill sends; its decode never comes
        w.prefill_request(p, 1.0)
        w.senders[p.rid].send(w.prefill_slots[p.rid][::PAGE] // PAGE)
        assert transport.LOOPBACK.sent(p.bootstrap_room) == 4
        del w.senders[p.rid]
        gc.collect()
        assert p.bootstrap_room not in transport.LOOPBACK.rooms(), "an orphaned room outlived its sender"
    finally:
        transport.LOOPBACK = saved


_RECEIVERS = {"nic": NicKVReceiver, "opaque": OpaqueKVReceiver}


def _get_kv_class(original):
    """"nic" is a test transport: the fake one's classes with its own receiver."""

    def get_kv_class(backend, class_type):
        if backend in _RECEIVERS and class_type == KVClassType.RECEIVER:
            return _RECEIVERS[backend]
        return original(TransferBackend.FAKE if backend in _RECEIVERS else backend, class_type)

    return get_kv_class


SCENARIOS = {
    "full": (full_transfer, {}),
    "oversized": (oversized, {}),
    "oversized/accepts_partial": (oversized, {"twin": AcceptsPartialCoverage}),
    "one_of_many/coverage": (one_page_of_many, {"sent_pages": 1, "message": "covered 4 of 16"}),
    "one_of_many/unwritten": (one_page_of_many, {"sent_pages": 4, "message": "reserved page 1 of 4"}),
    "one_of_many/coverage/accepts_partial": (one_page_of_many, {"sent_pages": 1, "message": "covered 4 of 16",
                                                                "twin": AcceptsPartialCoverage}),
    "one_of_many/unwritten/accepts_partial": (one_page_of_many, {"sent_pages": 4, "message": "reserved page 1 of 4",
                                                                 "twin": AcceptsPartialCoverage}),
    "late_write": (late_write, {}),
    "late_write/no_generation_check": (late_write, {"twin": True}),
    "lost_ack": (lost_ack, {}),
    "lost_ack/frees_on_timeout": (lost_ack, {"twin": FreesOnTimeout}),
    "ack_deadline": (ack_deadline, {}),
    "limit_mismatch": (limit_mismatch, {}),
    "limit_mismatch/skips_check": (limit_mismatch, {"twin": SkipsLimitCheck}),
    "unsupported_transport": (unsupported_transport, {}),
    "reserve_refused": (reserve_refused, {}),
    "reserve_refused/allocates_before_refusing": (reserve_refused, {"twin": AllocatesBeforeRefusing}),
    "board_pruned": (board_pruned, {}),
    "board_pruned/never_forgets": (board_pruned, {"board": NeverForgets}),
    "meta/full": (meta_full, {}),
    "meta/incident": (meta_incident, {}),
    "meta/incident/accepts_partial": (meta_incident, {"twin": AcceptsPartialCoverage}),
    "meta/stale_row": (meta_stale_row, {}),
    "meta/stale_row/skips_clearing": (meta_stale_row, {"adapter": SkipsClearingTheRow()}),
    "meta/late_write": (meta_late_write, {}),
    "meta/late_write/ignores_room": (meta_late_write, {"adapter": IgnoresTheRoom()}),
    "meta/limit_mismatch": (meta_limit_mismatch, {}),
    "meta/limit_mismatch/skips_check": (meta_limit_mismatch, {"twin": SkipsLimitCheck}),
    "no_transfer": (no_transfer_levels, {}),
    "no_transfer/admits_under_none": (no_transfer_levels, {"twin": AdmitsUnderNone}),
}


def main():
    features = disagg.install_in_sglang()
    assert features["decode_prealloc"] and features["prefill_add"], features
    transport.register(NicKVReceiver, NicTransport())
    dmod.get_kv_class = _get_kv_class(dmod.get_kv_class)
    scenarios.report(SCENARIOS)
