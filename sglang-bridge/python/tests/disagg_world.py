"""Handoff scenarios through SGLang's own disaggregation queues with kvshield's hooks installed by the plug-in,
run in a subprocess by ``test_disagg_hooks.py``: a prefill pool with SGLang's ``PrefillBootstrapQueue`` and a
decode pool with its ``DecodePreallocQueue`` and ``DecodeTransferQueue``, ``DecodeReqToTokenPool``,
``MetadataBuffers``, ``ChunkCache`` and ``release_kv_cache``, one rank (a one-process gloo group for the poll
agreement). The transport is SGLang's fake one (``disaggregation/fake``: its manager, sender and receiver)
wired to the two in-process pools (:mod:`wire`): the wire is kvshield's in-process copy through both sides'
claims (``Handoff.copy_to``), or raw writes for a transport that writes decode memory itself, plus the
metadata copy SGLang's decode gate waits for.

Every scenario's oracle reads bytes back from the decode pool; its planted-bug twins (below, test code only)
must make it fail. ``main`` prints one ``RESULTS <json>`` line: scenario → [pass|fail, message].
"""

import contextlib
import inspect
import os
import time
import types

import torch
from sglang.srt.disaggregation import decode as dmod
from sglang.srt.disaggregation import prefill as pmod
from sglang.srt.disaggregation.base.conn import KVPoll
from sglang.srt.disaggregation.fake.conn import FakeKVReceiver
from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver
from sglang.srt.disaggregation.utils import (FAKE_BOOTSTRAP_HOST, MetadataBuffers, ReqToMetadataIdxAllocator,
                                             TransferBackend)
from sglang.srt.managers.schedule_batch import FINISH_ABORT
from sglang.srt.mem_cache import common
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.chunk_cache import ChunkCache

import scenarios
import servers
import wire
from fakes import MHAPool, widened_index
from kvshield_sglang import disagg, plugin, transport
from kvshield_sglang.errors import HandoffError
from kvshield_sglang.handoff import Handoff

SIZE, PAGE = 32, 4
PREFILL_PEER = 1  # the decode pool, as the prefill side names it
HOST = "10.0.0.1"


def _alloc(limit, level="ZERO"):
    import sglang.srt.mem_cache.allocator.paged as paged  # kvshield's class, swapped in by the plug-in

    kv = MHAPool(SIZE, PAGE, layers=2)
    a = paged.PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", kv, True, kvshield_settings={
        "level": level, "strict": True, "advertisedContextTokens": limit})
    return a, kv


def Req(rid, n, tenant, room, host=HOST):  # noqa: N802 (SGLang's class)
    """SGLang's Req as a disaggregated server builds it (bootstrap host, port and room), with its tenant."""
    return servers.request(rid, list(range(n)), tenant, bootstrap_host=host, bootstrap_port=8998, bootstrap_room=room)


class World:
    """Prefill and decode servers in one process, joined by SGLang's fake transport (``backend``: the receiver
    kind, see :mod:`wire`)."""

    _rooms = iter(range(1000, 10**6))

    def __init__(self, tag, decode_handoff=None, prefill_limit=32, decode_limit=32, backend=wire.FAKE,
                 level="ZERO", metadata_rows=8, decode_draft_layers=0):
        self.tag = tag
        self.pa, self.pkv = _alloc(prefill_limit, level)
        self.da, self.dkv = _alloc(decode_limit, level)
        # a decode server with a speculative draft model (EAGLE): its draft pool on the target's slots, in its KV transfers
        self.ddraft = MHAPool(SIZE, PAGE, layers=decode_draft_layers) if decode_draft_layers else None
        if self.ddraft is not None:
            self.da.kvshield_register_kvcache(self.ddraft)
        self.prefill, self.decode = Handoff(self.pa), Handoff(self.da)
        self.da.kvshield_handoff = decode_handoff(self.decode) if decode_handoff else self.decode
        self.streamed, self.pstreamed = [], []
        self.dsched = servers.disagg_scheduler(self.da, backend, self.streamed)
        self.psched = servers.disagg_scheduler(self.pa, backend, self.pstreamed)
        self.rows = dmod.DecodeReqToTokenPool(8, 64, "cpu", False, 8)
        self.tree = ChunkCache(CacheInitParams(disable=True, req_to_token_pool=self.rows,
                                               token_to_kv_pool_allocator=self.da, page_size=PAGE))
        self.dmeta, self.dmeta_rows = MetadataBuffers(metadata_rows, 4, torch.float32), ReqToMetadataIdxAllocator(metadata_rows)
        self.pmeta, self.pmeta_rows = MetadataBuffers(8, 4, torch.float32), ReqToMetadataIdxAllocator(8)
        self.tq = dmod.DecodeTransferQueue(None, self.dmeta_rows, 0, self.dmeta, self.dsched, self.tree)
        self.pre = dmod.DecodePreallocQueue(self.rows, self.da, self.ddraft, self.dmeta_rows, self.dmeta, self.dsched, self.tq,
                                            self.tree, None, 0, 1, 1, 0, 8998, SIZE, 0, 0, backend)
        self.pq = pmod.PrefillBootstrapQueue(self.pkv, None, self.pmeta_rows, self.pmeta, 0, 1, 0, 8998, None, SIZE,
                                             self.psched, 0, 1, backend)
        self.dsched.disagg_decode_prealloc_queue, self.dsched.disagg_decode_transfer_queue = self.pre, self.tq
        self.psched.disagg_prefill_bootstrap_queue = self.pq
        self.senders, self.prefill_slots = {}, {}

    def req(self, name, n, tenant="t1"):
        """The same request as prefill and decode each see it (one rid, one bootstrap room)."""
        rid, room = f"{self.tag}-{name}", next(self._rooms)
        return Req(rid, n, tenant, room), Req(rid, n, tenant, room)

    def prefill_request(self, req, value, begin=True):
        """The prefill server admits ``req`` (SGLang's bootstrap queue: sender, bootstrap), computes its KV (token
        i holds value + i; first output token 7) and starts sending."""
        self.pq.add(req, 1)
        if req not in self.pq.queue:
            return None
        return self.bootstrap_and_compute(req, value, begin)

    def bootstrap_and_compute(self, req, value, begin=True):
        """SGLang's bootstrap of a queued request (metadata row, sender init), then its KV computed."""
        assert self.pq.pop_bootstrapped() == [req]
        n = len(req.origin_input_ids)
        self.pa.set_plan([(req, req.kvshield_tenant, 0, n)])  # a request is its Req object, as the plug-in plans it
        slots = self.pa.alloc(-(-n // PAGE) * PAGE)
        self.pa.clear_plan()
        for b in self.pkv.buffers():
            b[slots[:n]] = (value + torch.arange(n, dtype=torch.float32))[:, None, None]
        req.output_ids.append(7)
        self.pmeta.set_buf(req)
        if begin:
            self.prefill.ensure_peer(PREFILL_PEER, self.decode.effective_limit())
            self.prefill.begin(req, req.kvshield_tenant, n, slots, PREFILL_PEER)
        self.senders[req.rid] = req.disagg_kv_sender
        self.prefill_slots[req.rid] = slots[:n]
        self.preqs = getattr(self, "preqs", {})
        self.preqs[req.rid] = req
        return slots[:n]

    def decode_request(self, req):
        """The decode server takes ``req``: prealloc queue, then (if preallocated) the transfer queue."""
        self.pre.add(req)
        preallocated, failed = self.pre.pop_preallocated()
        self.tq.extend(preallocated)
        return preallocated, failed

    def receiver(self, req):
        return next(d.kv_receiver for d in self.tq.queue if d.req is req)

    def send(self, req, pages, land=None):
        """Prefill's sender sends decode request ``req``'s first ``pages`` pages; the wire lands ``land`` of them
        (default: all sent) through both sides' claims (prefill's Req of the request to decode's), then the
        request's metadata row."""
        rid = req.rid
        page_ids = self.prefill_slots[rid][::PAGE] // PAGE
        self.senders[rid].send(page_ids[:pages].to(torch.int32).numpy())
        self.prefill.copy_to(self.decode, self.preqs[rid], 0, pages if land is None else land, decode_rid=req)
        wire.copy_metadata(self.pmeta, self.preqs[rid].metadata_buffer_index, self.dmeta,
                           self.receiver(req).aux_index)

    def decode_slots(self, req):
        return self.rows.req_to_token[req.req_pool_idx, : len(req.origin_input_ids)].to(torch.int64)

    def decode_token(self, req, position, last_slots, value=None, token=None):
        """One decode step of ``req`` as SGLang's ``alloc_for_decode`` plans it: a slot for ``position`` after
        ``last_slots`` (its last slot, SGLang's ``last_loc``), written to its row and committed, its KV set to
        ``value`` and ``token`` appended to its output when given. Returns the slot tensor, or None (nothing
        written) when the pool refuses it."""
        self.da.set_plan([(req, req.kvshield_tenant, position, position + 1)])
        nxt = self.da.alloc_decode(torch.tensor([position + 1]), torch.tensor([position + 1]), last_slots)
        self.da.clear_plan()
        if nxt is None:
            return None
        self.rows.write((req.req_pool_idx, slice(position, position + 1)), nxt)
        if value is not None:
            for b in self.dkv.buffers():
                b[nxt] = value
        req.kv_committed_len = req.kv.kv_allocated_len = position + 1
        if token is not None:
            req.output_ids.append(token)
        return nxt

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
    assert torch.equal(w.decode.reserved_pages(d), torch.unique(w.decode_slots(d) // PAGE)), "receiver got other pages"
    w.send(d, 3)
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    assert view[0] == 200, view[:2]
    assert_safe(view, expected)
    assert w.decode.outcome(d) == "COMMITTED" and w.decode.unacknowledged() == 0
    # The committed pages are the request's own: its first decoded token goes into its last, partial page.
    dslots = w.decode_slots(d)
    nxt = w.decode_token(d, 10, dslots[-1:])
    assert nxt.tolist() == [int(dslots[-1]) + 1], (nxt, dslots)
    common.release_kv_cache(d, w.tree)  # the request finishes: SGLang releases its KV, then its row
    assert not w.decode.has_reservation(d)
    w.da.end_step()
    assert w.da.available_size() == before, (w.da.available_size(), before)


class Int32Rows(torch.Tensor):
    """SGLang's ``req_to_token`` rows are int32 and index the KV buffers directly (``get_cpu_copy``/``load_cpu_copy``
    of a retraction); torch 2 accepts that, this machine's torch 1.13 does not, so such an index is widened to
    int64 here (values unchanged)."""

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        if func in (torch.Tensor.__getitem__, torch.Tensor.__setitem__) and len(args) > 1:
            args = (args[0], widened_index(args[1]), *args[2:])
        return super().__torch_function__(func, types_, args, kwargs or {})


class PlansNothingOnResume(_Wrapper):
    """Planted bug: the resumed request's pages are allocated with no plan row (unattributed, the default
    tenant's), as a hook that passes SGLang's ``_pre_alloc`` outside a handoff straight through does."""

    @contextlib.contextmanager
    def resuming(self, w, req):
        set_plan = w.da.set_plan
        w.da.set_plan = lambda rows: set_plan([])
        try:
            yield
        finally:
            del w.da.set_plan


class ReservesOnResume(_Wrapper):
    """Planted bug: the resumed request's ``_pre_alloc`` is taken for a handoff's (as if it ran inside
    ``pop_preallocated`` with the request admitted): a second reservation, over its whole sequence so far, for a
    request whose KV comes from its host copy and whose transfer will never write or acknowledge it."""

    @contextlib.contextmanager
    def resuming(self, w, req):
        self.real.peer_of[req] = transport.peer_id(f"{req.bootstrap_host}:{req.bootstrap_port}")
        token = disagg._RESERVING.set(disagg._Pass(self))
        try:
            yield
        finally:
            disagg._RESERVING.reset(token)


def decoding_request(w, value=100.0):
    """Request ``r`` of 10 tokens prefilled (token i holds ``value`` + i), transferred and committed on the decode side
    (exactly the prompt's bytes, its transfer acknowledged), then its first decode step: token 7 at position 10 (its
    partial last page, ``value`` + 10), token 8 sampled. Returns (prefill Req, decode Req)."""
    w.rows.req_to_token = w.rows.req_to_token.as_subclass(Int32Rows)  # SGLang's retraction indexes the KV by its rows
    p, d = w.req("r", 10)
    prompt = w.pkv.read(w.prefill_request(p, value))
    w.decode_request(d)
    w.send(d, 3)
    view = w.client_view(d, w.tq.pop_transferred())
    assert view[0] == 200, view[:2]
    assert_safe(view, prompt)
    assert w.decode.unacknowledged() == 0 and w.decode.outcome(d) == "COMMITTED"
    w.decode_token(d, 10, w.decode_slots(d)[-1:], value=value + 10, token=8)
    return p, d


def retracted_and_resumed(twin=None):
    """A committed request decodes a token, is retracted under memory pressure and resumed, through SGLang's own
    retraction (``release_req``: its KV copied to host, released as the request's, its row freed; the prealloc
    queue's ``add(is_retracted=True)``) and resumption (``resume_retracted_reqs``: ``_pre_alloc`` outside
    ``pop_preallocated``, the host copy loaded back), while another tenant's KV sat on the freed pages. Its handoff
    ended with its first life: the resumed request gets no second reservation, its pages are its own (its tenant,
    its request id, its page list: the next token goes into its partial page), it reads exactly its bytes, and its
    release frees each page once (nothing refused) and gives the whole pool back."""
    from types import SimpleNamespace

    from sglang.srt.managers.schedule_batch import release_req

    w = World(f"retract-{twin is not None}", decode_handoff=twin)
    full = w.da.available_size()
    _, d = decoding_request(w)
    expected = w.dkv.read(w.rows.req_to_token[d.req_pool_idx, :11].to(torch.int64)).clone()
    # Retraction (SGLang's decode retraction of a running request) and re-queueing as retracted.
    assert release_req(req=d, remaing_req_count=0, server_args=SimpleNamespace(disaggregation_mode="decode"),
                       req_to_token_pool=w.rows, token_to_kv_pool_allocator=w.da, tree_cache=w.tree,
                       hisparse_coordinator=None)
    assert d.req_pool_idx is None and d.kv is None and w.da.rejected_frees() == 0
    assert not w.decode.has_reservation(d), "the retracted request's handoff record outlived its release"
    w.da.end_step()
    assert w.da.available_size() == full, (w.da.available_size(), full)
    other = f"{w.tag}-other"  # another tenant's KV on every page the retraction gave back
    w.da.set_plan([(other, "t2", 0, SIZE)])
    stale = w.da.alloc(SIZE)
    w.da.clear_plan()
    for b in w.dkv.buffers():
        b[stale] = -5.0
    with w.da.releasing("t2", other):
        w.da.free(stale)
    w.da.end_step()
    w.pre.add(d, is_retracted=True)
    assert w.pre.retracted_queue == [d] and w.pre.queue == []
    # Resumption.
    with (w.da.kvshield_handoff.resuming(w, d) if twin else contextlib.nullcontext()):
        resumed = w.pre.resume_retracted_reqs()
    assert resumed == [d] and w.pre.retracted_queue == [], resumed
    assert not w.decode.has_reservation(d), "the resumed request got a second handoff reservation"
    slots = w.rows.req_to_token[d.req_pool_idx, :11].to(torch.int64)
    owners = {w.da.page_owner(int(s) // PAGE) for s in slots}
    assert owners == {(d.kvshield_tenant, w.da.request_id(d))}, f"the resumed request's pages are not its own: {owners}"
    assert torch.equal(w.dkv.read(slots), expected), "the resumed request reads bytes it never computed"
    # Its next token (position 11) goes into its own partial page, named from its page list (no device read).
    syncs = w.da.host_syncs()
    nxt = w.decode_token(d, 11, slots[-1:])
    assert nxt.tolist() == [int(slots[-1]) + 1] and w.da.host_syncs() == syncs, (nxt, slots, w.da.host_syncs())
    # It finishes: SGLang releases its KV (each page once, as the request's), then its row.
    common.release_kv_cache(d, w.tree)
    assert w.da.rejected_frees() == 0, f"the resumed request's release was refused {w.da.rejected_frees()} page(s)"
    assert not w.decode.has_reservation(d) and w.decode.unacknowledged() == 0
    w.da.end_step()
    assert w.da.available_size() == full, f"pages leaked: {w.da.available_size()} of {full}"


def oversized(twin=None):
    w = World("oversized", decode_handoff=twin, prefill_limit=16, decode_limit=16)  # kvshield's limit, under SGLang's
    limit = w.decode.effective_limit()
    before = w.da.available_size()
    _, big = w.req("big", limit + 1)
    preallocated, failed = w.decode_request(big)
    assert preallocated == [] and [x.req for x in failed] == [big], (limit, preallocated, failed, big.finished_reason)
    assert w.client_view(big, [])[:2] == (400, "abort"), big.finished_reason.to_json()
    assert str(limit + 1) in big.finished_reason.message, big.finished_reason.message
    assert w.da.available_size() == before and not w.decode.has_reservation(big)
    assert all(torch.count_nonzero(b).item() == 0 for b in w.dkv.buffers()), "decode holds bytes of a rejected request"
    # The incident: prefill rejects the prompt and shrinks it to a one-token placeholder; decode asks for the full prompt.
    p, d = w.req("ph", limit)
    p.set_finish_with_abort("prompt too long")  # SGLang's validation: a one-token placeholder, to finish aborted
    assert w.prefill_request(p, 5.0) is None and w.pq.queue == []
    assert p.finished_reason.status_code == 400 and p in w.pstreamed
    # An SGLang without the prefill check hands the placeholder off anyway: one token of KV is sent.
    p.finished_reason = None
    assert pmod.PrefillBootstrapQueue.create_sender._kvshield_original(w.pq, p, 1)  # SGLang's own check passes it
    w.pq.queue.append(p)
    src = w.bootstrap_and_compute(p, 5.0)
    n = 1
    preallocated, _ = w.decode_request(d)
    assert [x.req for x in preallocated] == [d]
    dslots = w.decode_slots(d)
    for b in w.dkv.buffers():  # stale KV of an earlier request on the decode pool's memory
        b[dslots] = -9.0
    expected = torch.cat([w.pkv.read(src[:n]), torch.zeros(4, limit - n, 1, 4)], dim=1)
    w.send(d, 1)
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    assert_safe(view, expected)
    assert view[:2] == (500, "abort") and "covered 4 of" in d.finished_reason.message, view[:2]


def one_page_of_many(sent_pages, message, twin=None):
    w = World(f"one-of-many-{sent_pages}", decode_handoff=twin)
    full = w.da.available_size()
    p, d = w.req("r", 16)
    expected = w.pkv.read(w.prefill_request(p, 10.0))
    w.decode_request(d)
    w.send(d, sent_pages, land=1)  # only the first of four pages lands
    done = w.tq.pop_transferred()
    view = w.client_view(d, done)
    assert_safe(view, expected)
    assert view[:2] == (500, "abort"), view[:2]
    assert message in d.finished_reason.message and d in w.streamed, d.finished_reason.message
    assert not w.decode.has_reservation(d) and w.decode.unacknowledged() == 0  # refused, then acknowledged
    # The refusal released the pages; SGLang's release of the request then freed none of them again.
    assert d.req_pool_idx is None and w.da.rejected_frees() == 0, (d.req_pool_idx, w.da.rejected_frees())
    w.da.end_step()
    assert w.da.available_size() == full, f"pages leaked: {w.da.available_size()} of {full}"


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
    assert w.decode.unacknowledged() == 0 and not w.decode.has_reservation(a)
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
            w.prefill.copy_to(w.decode, p, 0, 2, decode_rid=a)
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
    tenant = w.da.tenant_id("t9")
    lease = pool.view().leaseOf(page, tenant, owner, jpype.JClass("dev.kvshield.lease.LeaseKind").OWNER)
    assert lease != jpype.JClass("dev.kvshield.lease.LeaseIds").NONE, "the hog does not hold its page"
    held, out = jpype.JArray(jpype.JLong)([lease]), jpype.JArray(jpype.JLong)(1)
    for _ in range(int(pool.config().maxClaims()) - _live_claims(w) - keep):
        pool.claim(tenant, owner, held, 0, 1, reader, 7, out, 0)


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
    assert "LeaseCapacityException" in a.finished_reason.message and "claims asked for" in a.finished_reason.message \
        and w.streamed.count(a) == 1, a.finished_reason.message
    assert not w.decode.has_reservation(a) and a.req_pool_idx is None and a.kv_committed_len == 0
    assert w.rows.available_size() == rows_before - 1, (w.rows.available_size(), rows_before)  # B's row only
    assert w.da.available_size() == pages_before - PAGE, f"pages leaked: {w.da.available_size()} of {pages_before}"
    assert _live_claims(w) == claims_before + 1, (_live_claims(w), claims_before)  # B's writer claim only
    assert all(torch.count_nonzero(buf).item() == 0 for buf in w.dkv.buffers()), "decode holds bytes of a refused request"
    assert w.pre.pop_preallocated() == ([], []) and w.streamed.count(a) == 1, "the abort was streamed twice"
    w.tq.extend(preallocated)
    w.send(b, 1)
    view = w.client_view(b, w.tq.pop_transferred())
    assert view[0] == 200, view[:2]
    assert_safe(view, expected_b)


class NicTransport(transport.FakeTransport):
    name = "nic"

    def acknowledged(self, receiver):
        return False


def lost_ack(twin=None):
    w = World(f"lost-ack-{twin is not None}", decode_handoff=twin, backend=wire.NIC)
    p, a = w.req("A", 8)
    src = w.prefill_request(p, 70.0)
    w.decode_request(a)
    a_slots = w.decode_slots(a)
    for b_src, b_dst in zip(w.pkv.buffers(), w.dkv.buffers()):
        b_dst[a_slots[:4]] = b_src[src[:4]]
    w.decode.record_written(a, 0, 0, 4)
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
    assert w.decode.outcome(a) == "ABORTED" and w.decode.unacknowledged() == 1, w.decode.outcome(a)
    assert len(w.decode.alarms()) == 1 and "never acknowledged" in w.decode.alarms()[0], w.decode.alarms()
    # Back-pressure: A's two pages stay out of circulation; a request needing them waits in the prealloc queue.
    assert w.da.available_size() == SIZE - 8 - 8, w.da.available_size()
    _, c = w.req("C", SIZE - 8, "t3")
    preallocated, failed = w.decode_request(c)
    assert preallocated == [] and failed == [] and [x.req for x in w.pre.queue] == [c], (preallocated, failed)


def ack_deadline():
    """Given up, unacknowledged: nothing happens before the deadline; the first sweep past it expires."""
    w = World("deadline", backend=wire.NIC)
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
    assert w.da.available_size() == before and not w.decode.has_reservation(d)


def unsupported_transport():
    w = World("unsupported", backend=wire.OPAQUE)
    p, d = w.req("r", 8)
    w.prefill_request(p, 1.0)
    preallocated, failed = w.decode_request(d)
    assert preallocated == [] and [x.req for x in failed] == [d], (preallocated, failed)
    msg = d.finished_reason.message
    assert d.finished_reason.status_code == 500 and "wire.OpaqueKVReceiver" in msg, msg
    assert "register" in msg, msg
    assert not w.decode.has_reservation(d)


# ---------------------------------------------------------------- Mooncake: coverage in the metadata transfer

class PrefillScheduler(pmod.SchedulerDisaggregationPrefillMixin):
    """SGLang's prefill scheduler for its ``send_kv_chunk`` (the state that method reads)."""

    def __init__(self, world, rows):
        self.req_to_token_pool, self.token_to_kv_pool_allocator = rows, world.pa
        self.disagg_metadata_buffers, self.disagg_prefill_bootstrap_queue = world.pmeta, world.pq
        self.enable_staging, self.disagg_prefill_pending_chunk_rids, self.sliding_window_size = False, set(), None


class MooncakeWorld(World):
    """Prefill and decode servers joined by a transport that copies SGLang's metadata buffers (a Mooncake
    receiver, :class:`wire.MetadataKVReceiver`): prefill sends through SGLang's ``send_kv_chunk``; KV pages and
    metadata rows are raw copies between the two pools (:class:`wire.Route`); both sides' metadata buffers
    carry kvshield's row."""

    def __init__(self, tag, metadata_rows=8, aux_buffers=None, **kw):
        super().__init__(tag, backend=wire.METADATA, metadata_rows=metadata_rows, **kw)
        self.prows = dmod.DecodeReqToTokenPool(8, 64, "cpu", False, 8)
        self.prefiller = PrefillScheduler(self, self.prows)
        self.aux_buffers = aux_buffers

    def prefill_request(self, req, value, begin=False):
        """The prefill server admits ``req``, bootstraps it and computes its KV (token i holds value + i) into a
        ``req_to_token`` row, as SGLang's prefill forward leaves it; its first output token is 7."""
        self.pq.add(req, 1)
        if req not in self.pq.queue:
            return None
        slots = self.bootstrap_and_compute(req, value, begin=False)
        self.prows.alloc([req])
        self.prows.write((req.req_pool_idx, slice(0, len(slots))), slots.to(torch.int32))
        req.set_extend_range(0, len(slots))
        return slots

    def decode_request(self, req):
        out = super().decode_request(req)
        for d in self.tq.queue:
            if d.req is req:
                wire.ROUTES[req.bootstrap_room] = wire.Route(self.pkv, self.dkv, d.kv_receiver, self.pmeta, self.dmeta,
                                                             PAGE, self.aux_buffers)
        return out

    def send_chunk(self, req, end_idx=None, last=False):
        self.prefiller.send_kv_chunk(req, last_chunk=last, end_idx=end_idx)


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
    assert list(d.output_ids) == [7], f"the metadata transfer did not land: {d.output_ids}"
    assert w.decode.outcome(d) == "COMMITTED" and w.decode.unacknowledged() == 0
    common.release_kv_cache(d, w.tree)
    assert not w.decode.has_reservation(d)


def meta_draft_not_carried(level, twin=False):
    """A decode server with an EAGLE draft model, its prefill without one (SGLang's transports support it: only the
    target layers are carried, ``get_mha_kv_ptrs_with_pp``): the draft KV of the reserved pages is never written by the
    transfer. Under ``NONE`` those pages keep an earlier request's draft KV (another tenant's, -9 here), which the
    draft model would read: refused, naming both buffer counts. Scrubbing levels hand the pages out zeroed: served."""
    if twin:  # planted bug: the buffers the prefill carried are never compared with the decode's
        checked, disagg._carries_every_buffer = disagg._carries_every_buffer, lambda *a: None
        try:
            return meta_draft_not_carried(level)
        finally:
            disagg._carries_every_buffer = checked
    w = MooncakeWorld(f"meta-draft-{level}", level=level, decode_draft_layers=1)
    p, d = w.req("r", 8)
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    w.decode_request(d)
    dslots = w.decode_slots(d)
    if level == "NONE":
        for b in w.ddraft.buffers():  # an earlier request's draft KV, left on unscrubbed pages
            b[dslots] = -9.0
    w.send_chunk(p, last=True)
    view = w.client_view(d, w.tq.pop_transferred())
    assert_safe(view, expected)
    if view[0] == 200:
        stale = w.ddraft.read(dslots)
        assert torch.count_nonzero(stale) == 0, f"decode serves draft KV the transfer never wrote: {stale[0, :, 0, 0].tolist()}"
    if level == "NONE":
        assert view[:2] == (500, "abort") and "carried 4 KV buffers" in d.finished_reason.message \
            and "hold 6" in d.finished_reason.message, d.finished_reason.message
        assert w.decode.unacknowledged() == 0, "the refused transfer's own Success was not its acknowledgement"
    else:
        assert view[0] == 200, (view[:2], d.finished_reason)


def _placeholder(w, p, value):
    """Prefill shrank ``p`` to a one-token placeholder without marking it finished: it is bootstrapped."""
    ph = Req(p.rid, 1, p.kvshield_tenant, p.bootstrap_room, p.bootstrap_host)
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


def meta_cross_tenant(twin=False):
    """A bootstrap room two tenants' requests share (reused, colliding or client-chosen): prefill sends tenant t2's
    prompt, the transport lands it in the decode request of tenant t1 holding that room. The row names t2's
    tenant, so decode refuses the commit and t1 reads none of t2's KV. Twin: the tenant comparison skipped."""
    w = MooncakeWorld(f"meta-cross-tenant-{twin}")
    rid, room = f"{w.tag}-r", next(World._rooms)
    p, d = Req(rid, 8, "t2", room), Req(rid, 8, "t1", room)
    src = w.prefill_request(p, 500.0)
    w.decode_request(d)
    same_tenant = disagg._same_tenant
    if twin:
        disagg._same_tenant = lambda *args: None
    try:
        w.send_chunk(p, last=True)
        view = w.client_view(d, w.tq.pop_transferred())
    finally:
        disagg._same_tenant = same_tenant
    assert not (view[0] == 200 and torch.equal(view[2], w.pkv.read(src))), "tenant t1's request decoded over t2's KV"
    assert view[:2] == (500, "abort") and "another tenant" in d.finished_reason.message, view[:2]


class PerSenderRoute:
    """Mooncake's write placement for one bootstrap room: every sender of the room writes chunk k of its request
    into the decode pages the receiver named for chunk k (the chunk's ``index_slice``: its own send progress), and
    copies the metadata after its own last chunk, as SGLang's Mooncake does: each sender's ``send`` takes
    ``index_slice = slice(curr_idx, curr_idx + len(kv_indices))`` from its own progress
    (``disaggregation/common/conn.py``), and ``MooncakeKVManager.add_transfer_request`` looks the destination up by
    room only (``self.transfer_infos[bootstrap_room]``), so two prefill requests carrying one room (client-chosen,
    colliding, reused) both write into the decode pages of that room's receiver."""

    def __init__(self, route):
        self.route, self.sent = route, {}

    def carry(self, sender, page_ids):
        r, ps = self.route, self.route.page_size
        done = self.sent.get(id(sender), 0)
        for i, src_page in enumerate(int(p) for p in page_ids):
            dst_page = int(r.receiver.kv_indices[done + i])
            for s, d in zip(r.src_kv.buffers(), r.dst_kv.buffers()):
                d[dst_page * ps:(dst_page + 1) * ps] = s[src_page * ps:(src_page + 1) * ps]
        self.sent[id(sender)] = done + len(page_ids)
        if self.sent[id(sender)] >= sender.num_pages:
            wire.copy_metadata(r.src_meta, sender.aux_index, r.dst_meta, r.receiver.aux_index, r.receiver, r.buffers)


def meta_shared_room(twin=False):
    """Tenant t2's client chooses the bootstrap room of tenant t1's request in flight on the same prefill server.
    SGLang's Mooncake finds a room's destination by room alone and each sender writes its chunks at its own
    progress (:class:`PerSenderRoute`), so t2's first chunk would land in t1's decode pages and t1's own row
    would then commit them. The prefill server refuses t2's request (400) while t1's holds the room; t1 decodes
    exactly its own KV. Twin: the room check skipped, t1 decodes over t2's KV."""
    w = MooncakeWorld(f"meta-shared-room-{twin}")
    room = next(World._rooms)
    p1, d = Req(f"{w.tag}-t1", 16, "t1", room), Req(f"{w.tag}-t1", 16, "t1", room)
    p2 = Req(f"{w.tag}-t2", 16, "t2", room)
    src1 = w.prefill_request(p1, 100.0)
    claim = disagg.PREFILL_ROOMS.claim
    if twin:
        disagg.PREFILL_ROOMS.claim = lambda req: None
    try:
        src2 = w.prefill_request(p2, 900.0)
    finally:
        disagg.PREFILL_ROOMS.claim = claim
    w.decode_request(d)
    wire.ROUTES[room] = PerSenderRoute(wire.ROUTES[room])
    w.send_chunk(p1, end_idx=8)
    if src2 is not None:
        w.send_chunk(p2, end_idx=8)  # not its last chunk: no row, its pages land in t1's
    w.send_chunk(p1, last=True)
    view = w.client_view(d, w.tq.pop_transferred())
    assert not (view[0] == 200 and bool((view[2] >= 900.0).any())), "tenant t1's request decodes over tenant t2's KV"
    assert_safe(view, w.pkv.read(src1))
    assert view[0] == 200, view[:2]
    assert src2 is None and p2.finished_reason.status_code == 400 and "bootstrap room" in p2.finished_reason.message


def decode_shared_room():
    """Two decode requests of different tenants on one bootstrap room at one decode server: the second is refused
    (400) before anything is reserved, so a transfer for that room can only land in the first one's pages."""
    w = MooncakeWorld("decode-shared-room")
    room = next(World._rooms)
    p1, d1 = Req("dsr-t1", 8, "t1", room), Req("dsr-t1", 8, "t1", room)
    d2 = Req("dsr-t2", 8, "t2", room)
    w.prefill_request(p1, 100.0)
    w.decode_request(d1)
    before = w.da.available_size()
    preallocated, failed = w.decode_request(d2)
    assert preallocated == [] and [x.req for x in failed] == [d2], (preallocated, failed)
    assert d2.finished_reason.status_code == 400 and "bootstrap room" in d2.finished_reason.message
    assert w.da.available_size() == before and not w.decode.has_reservation(d2)
    w.send_chunk(p1, last=True)
    view = w.client_view(d1, w.tq.pop_transferred())
    assert view[0] == 200 and torch.equal(view[2], w.pkv.read(w.prefill_slots[p1.rid])), view[:2]


def _prompt_kv(value, n):
    """The KV prefill computes for a prompt of ``n`` tokens (token i holds value + i), as ``_read`` returns it."""
    return (value + torch.arange(n, dtype=torch.float32))[None, :, None, None].expand(4, n, 1, 4)


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
    """A client reuses a bootstrap room; the second request's row never arrives (a transport that copies a fixed
    list of SGLang's metadata buffers, not every one ``get_buf_infos`` lists) while SGLang's own metadata (and
    its room check) does: the first request's row at the same metadata index must not be read as the second's."""
    w = MooncakeWorld(f"meta-stale-{adapter is not None}", metadata_rows=1)
    with _mooncake_adapter(adapter):
        p1, d1 = w.req("r1", 8)
        w.prefill_request(p1, 10.0)
        w.decode_request(d1)
        w.send_chunk(p1, last=True)
        assert w.client_view(d1, w.tq.pop_transferred())[0] == 200
        common.release_kv_cache(d1, w.tree)
        w.da.end_step()
        disagg.PREFILL_ROOMS.release(p1)  # SGLang's prefill inflight queue saw p1's sender conclude (the hook frees it there)
        p2, d2 = w.req("r2", 8)
        d2.bootstrap_room = p2.bootstrap_room = d1.bootstrap_room
        w.aux_buffers = -1
        ph, _ = _placeholder(w, p2, 20.0)
        expected = _prompt_kv(20.0, 8)
        w.decode_request(d2)
        w.send_chunk(ph, last=True)
        view = w.client_view(d2, w.tq.pop_transferred())
        assert_safe(view, expected)
        assert view[:2] == (500, "abort") and "no kvshield coverage row arrived" in d2.finished_reason.message, view[:2]


def meta_late_write(adapter=None):
    """A's transfer is aborted on decode after 3 of 4 pages; SGLang frees its metadata index, but kvshield holds it
    while A's transfer is unacknowledged (A's prefill may still copy its metadata there): B waits for an index, A's
    prefill then sends its last chunk, whose metadata copy lands in A's own row, and B never reads it. Without the
    hold (a transport adapter that does not hold), the copy lands in B's row after B's own: SGLang's room check of its
    metadata refuses B before kvshield's row is read; either way B never decodes."""
    w = MooncakeWorld(f"meta-late-{adapter is not None}", metadata_rows=1)
    with _mooncake_adapter(adapter):
        pa, a = w.req("A", 16)
        w.prefill_request(pa, 30.0)
        w.decode_request(a)
        w.send_chunk(pa, end_idx=12)
        w.tq.queue[0].kv_receiver.abort()
        assert w.tq.pop_transferred() == [] and a.finished_reason.status_code == 500
        pb, b = w.req("B", 8)  # A's four pages stay held back: B fits in the rest
        ph, _ = _placeholder(w, pb, 40.0)
        preallocated, _ = w.decode_request(b)
        if not preallocated:  # A's metadata index is held: B waits for one
            assert b.finished_reason is None and any(d.req is b for d in w.pre.queue), b.finished_reason
            assert w.dmeta_rows.available_size() == 0, "A's metadata index went back while A is unacknowledged"
            w.send_chunk(pa, last=True)
            assert w.decode_request(b)[0] == [] and b.finished_reason is None, "B took A's held metadata index"
            return
        bslots = w.decode_slots(b)
        for buf in w.dkv.buffers():
            buf[bslots] = -9.0
        w.send_chunk(ph, last=True)
        w.send_chunk(pa, last=True)  # A's late last chunk: KV into A's (quarantined) pages, its row into B's
        expected = _prompt_kv(40.0, 8)
        view = w.client_view(b, w.tq.pop_transferred())
        assert_safe(view, expected)
        assert view[:2] == (500, "abort"), view[:2]
        assert any(m in b.finished_reason.message for m in ("belongs to bootstrap room", "Metadata corruption")), \
            b.finished_reason.message


def _decode_abort(w, req):
    """SGLang's ``Scheduler.abort_request`` (its unscoped body: which tenant may abort is ``test_tenant_aborts``'s) of
    ``req`` on the decode server: a request in the transfer queue has its receiver aborted and, under the deferred
    decode KV release, its room armed for the prefill ranks' drain acknowledgements."""
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.io_struct import AbortReq
    from sglang.srt.managers.scheduler import Scheduler

    s = w.dsched
    s.chunked_req = s.mm_receiver = s.dllm_config = None
    s.grammar_manager = types.SimpleNamespace(abort_requests=lambda recv_req: None)
    s.disaggregation_mode = DisaggregationMode.DECODE
    inspect.unwrap(Scheduler.abort_request)(s, AbortReq(rid=req.rid))  # NOTE: beneath every kvshield wrapper


def meta_drained_abort(acks=1, prefill_ranks=1, drained=None):
    """SGLang's deferred decode KV release (``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``): the client aborts A
    (tenant t1) on decode after the first of its 4 pages landed; SGLang holds A's pages until each of the ``prefill_ranks``
    prefill ranks acknowledges that its transfer drained (``acks`` of them do), or its hold times out (0 s here), then
    releases them. Every rank drained: that is the transfer's acknowledgement, so A's pages come back to the pool
    scrubbed, with its metadata index, and nothing is alarmed; B (tenant t2) gets every page and reads only zeros.
    Otherwise the transfer expires (alarm) and A's pages stay held back, so A's late last chunk never lands in the
    pages of C (tenant t2), which gets the rest. Twin (``drained``: kvshield's evidence replaced): a release without every rank's acknowledgement lets it."""
    saved_ranks, wire.MetadataKVReceiver.PREFILL_RANKS = wire.MetadataKVReceiver.PREFILL_RANKS, prefill_ranks
    saved_drained = disagg._drained
    try:
        w = MooncakeWorld(f"meta-drained-{acks}-{prefill_ranks}-{drained is not None}")
        pa, a = w.req("A", 16)
        w.prefill_request(pa, 30.0)
        w.decode_request(a)
        receiver, a_pages = w.receiver(a), set((w.decode_slots(a) // PAGE).tolist())
        receiver.kv_mgr.enable_deferred_decode_kv_release = True
        w.tq.enable_deferred_kv_release, w.tq.deferred_kv_release_timeout = True, 0.0
        w.send_chunk(pa, end_idx=4)
        _decode_abort(w, a)
        assert w.tq.pop_transferred() == [] and a.finished_reason.status_code == 500, a.finished_reason
        assert w.tq.has_pending_deferred_releases(), "SGLang released an aborted transfer's pages without holding them"
        for rank in range(acks):
            receiver.kv_mgr.note_abort_ack(a.bootstrap_room, rank)  # prefill rank `rank`: its transfer drained
        if drained is not None:
            disagg._drained = drained
        w.tq.resolve_deferred_releases()
        assert not w.tq.has_pending_deferred_releases()
        w.tq.pop_transferred()  # the next step's sweep
        w.da.end_step()
        if acks >= prefill_ranks:
            assert w.decode.unacknowledged() == 0 and w.decode.alarms() == [], w.decode.alarms()
            assert w.dmeta_rows.available_size() == w.dmeta_rows.size, "A's metadata index was not given back"
            _, b = w.req("B", 16, "t2")
            assert w.decode_request(b)[0], "A's drained pages did not come back to the pool"
            assert set((w.decode_slots(b) // PAGE).tolist()) == a_pages, "B did not get A's pages"
            seen = w.dkv.read(w.decode_slots(b))
            assert torch.count_nonzero(seen) == 0, f"B (tenant t2) read A's KV before its transfer: {seen.unique()}"
            return
        _, c = w.req("C", 8, "t2")
        assert w.decode_request(c)[0], "C does not fit beside A's held-back pages"
        cslots = w.decode_slots(c)
        before = w.dkv.read(cslots).clone()
        w.send_chunk(pa, last=True)  # A's late last chunk: into A's held-back pages, never C's
        assert torch.equal(w.dkv.read(cslots), before), "A's late chunk landed in C's pages (tenant t2)"
        assert not a_pages & set((cslots // PAGE).tolist()), "C got A's pages while A's transfer is unacknowledged"
        assert w.decode.outcome(a) == "ABORTED" and "never acknowledged" in " ".join(w.decode.alarms()), \
            (w.decode.outcome(a), w.decode.alarms())
    finally:
        wire.MetadataKVReceiver.PREFILL_RANKS = saved_ranks
        disagg._drained = saved_drained


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
    assert not w.decode.has_reservation(d) or w.decode.outcome(d) != "COMMITTED"


class SkipsClearingTheRow(transport.MetadataTransport):
    """Planted bug: the row a request's metadata index names is not cleared when the request is preallocated."""

    def bind(self, receiver, req, metadata_buffers, index_allocator=None):
        send_metadata = receiver.send_metadata
        super().bind(receiver, req, metadata_buffers, index_allocator)
        state = receiver._kvshield_row

        def keeps_row(kv_indices, aux_index=None, *a, **k):
            state.index = int(aux_index)
            state.owners[state.index] = state
            return send_metadata(kv_indices, aux_index, *a, **k)

        receiver.send_metadata = keeps_row


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
    w = World(f"no-transfer-{level}-{twin is not None}", decode_handoff=twin, backend=wire.METADATA, level=level)
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
        assert w.decode.no_transfer_admitted == 1 and not w.decode.has_reservation(d)
        assert w.decode.no_transfer_served == 1 and w.decode.no_transfer == {}
        common.release_kv_cache(d, w.tree)
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
        w, nic = World(f"board-{board is not None}"), World(f"board-nic-{board is not None}", backend=wire.NIC)
        rooms = []
        for name, n, pages in (("ok1", 8, 2), ("ok2", 4, 1), ("short", 8, 1)):
            p, d = w.req(name, n)
            rooms.append(d.bootstrap_room)
            w.prefill_request(p, 1.0)
            w.decode_request(d)
            w.send(d, pages)
            for r in w.tq.pop_transferred():  # the committed ones decode and finish
                common.release_kv_cache(r, w.tree)
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
        w.send(d, 1, land=0)
        w.tq.queue[0].kv_receiver.abort()
        w.tq.pop_transferred()
        p, d = nic.req("expired", 8)
        rooms.append(d.bootstrap_room)
        nic.prefill_request(p, 1.0)
        nic.decode_request(d)
        nic.send(d, 1)
        nic.tq.queue[0].kv_receiver.abort()
        nic.tq.pop_transferred()
        nic.pre.pop_preallocated()  # the acknowledgement deadline (0 s here) passes: expired
        assert nic.decode.outcome(d) == "ABORTED" and len(nic.decode.alarms()) == 1, nic.decode.alarms()
        assert d.finished_reason.status_code == 500, d.finished_reason.to_json()
        left = set(rooms) & set(transport.LOOPBACK.rooms())
        assert not left and len(w.senders) + len(nic.senders) == len(rooms), f"the board still holds rooms {sorted(left)}"
        p, _ = w.req("orphan", 4)  # prefill sends; its decode never comes
        w.prefill_request(p, 1.0)
        w.senders[p.rid].send(w.prefill_slots[p.rid][::PAGE] // PAGE)
        assert transport.LOOPBACK.sent(p.bootstrap_room) == 4
        del w.senders[p.rid]
        w.preqs.pop(p.rid).disagg_kv_sender = None  # the request is done with its sender
        gc.collect()
        assert p.bootstrap_room not in transport.LOOPBACK.rooms(), "an orphaned room outlived its sender"
    finally:
        transport.LOOPBACK = saved


# ---------------------------------------------------------------- the bootstrap queue, the metadata row, newer SGLang

def prefill_refuses():
    """SGLang's bootstrap queue never creates a sender for a request SGLang already refused (its validation set
    it to finish, shrunk to one token) or one over the pool's effective limit: 400, streamed, never queued."""
    w = World("prefill-refuses", prefill_limit=16)
    limit = w.pa.admission_limits()[0]
    (rejected, _), (oversized, _), (fine, _) = w.req("r1", 20), w.req("r2", limit + 1), w.req("r3", 8)
    rejected.set_finish_with_abort("Input length (20 tokens) exceeds the maximum allowed length")
    for r in (rejected, oversized, fine):
        w.pq.add(r, 1)
    assert w.pq.queue == [fine] and w.pstreamed == [rejected, oversized], (w.pq.queue, w.pstreamed)
    for r in (rejected, oversized):
        assert r.finished_reason.status_code == 400 and getattr(r, "disagg_kv_sender", None) is None, r.rid


def at_the_limit():
    """The edge lengths through SGLang's queues: a prompt of exactly the pools' effective limit gets a sender, a
    reservation, and commits its exact bytes; one token more is refused at the prefill's bootstrap queue (400,
    naming both numbers) and never gets a sender."""
    w = World("at-limit", prefill_limit=16, decode_limit=16)
    limit = w.pa.admission_limits()[0]
    assert limit == w.decode.effective_limit(), (limit, w.decode.effective_limit())
    p, d = w.req("r", limit)
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    preallocated, _ = w.decode_request(d)
    assert [x.req for x in preallocated] == [d], d.finished_reason
    w.send(d, -(-limit // PAGE))
    view = w.client_view(d, w.tq.pop_transferred())
    assert view[0] == 200, view[:2]
    assert_safe(view, expected)
    (over, _) = w.req("over", limit + 1)
    assert w.prefill_request(over, 5.0) is None and getattr(over, "disagg_kv_sender", None) is None
    message = over.finished_reason.message
    assert over.finished_reason.status_code == 400 and f"{limit + 1} tokens" in message and f"limit of {limit}" in message, message


def metadata_row():
    """SGLang's MetadataBuffers list kvshield's row last (every transport that copies what get_buf_infos lists
    carries it), and the request's sender writes it before its last send hands the chunk to the transport."""
    w = World("row")
    ptrs, lens, items = w.pmeta.get_buf_infos()
    row = w.pmeta.kvshield_coverage
    assert ptrs[-1] == row.data_ptr() and items[-1] == transport.ROW_WORDS * 8 and lens[-1] == row.shape[0] * items[-1]
    p, _ = w.req("r", 10)
    w.prefill_request(p, 1.0, begin=False)
    idx, seen = p.metadata_buffer_index, []
    sender = wire.WireKVSender(w.pq.kv_manager, f"{HOST}:8998", p.bootstrap_room, [0], 0)
    sender.send = lambda kv_indices, *a, **k: seen.append(row[idx, :6].tolist())  # what the transport copies now
    assert transport.arm_sender(sender, p, w.pmeta, PAGE, 32, tenant="acme", carried=transport.kv_buffers(w.pq.kv_manager))
    sender.init(3, idx)
    sender.send([5, 6])
    sender.send([7])
    assert seen == [[0] * 6, [transport.ROW_MAGIC, p.bootstrap_room, 10, 32, transport.tenant_tag("acme"), 4]], seen
    assert transport.tenant_tag("acme") != transport.tenant_tag("globex")


def newer_sglang_rejects_before_the_handoff():
    """NEWER-SGLANG SHAPE, monkeypatched into the real modules (labelled in test_disagg_hooks): the scheduler
    finishes a refused request before the bootstrap queue, and the decode prealloc queue's ``add`` finishes an
    aborted one before creating its receiver. kvshield's hooks then see neither; nothing is reserved and the
    client gets SGLang's 400."""
    import test_disagg_hooks
    from sglang.srt.disaggregation.utils import DisaggregationMode, is_aborted, prepare_abort
    from sglang.srt.managers.scheduler import Scheduler

    w = World("newer")
    s = servers.scheduler()
    s.disaggregation_mode, s.disagg_prefill_bootstrap_queue = DisaggregationMode.PREFILL, w.pq
    s.output_streamer = w.psched.output_streamer
    add = test_disagg_hooks.newer_add_request_to_queue(Scheduler._add_request_to_queue)
    p, d = w.req("r", 8)
    p.set_finish_with_abort("Input length exceeds the maximum allowed length")
    add(s, p)
    assert w.pq.queue == [] and w.pstreamed == [p] and p.finished_reason.status_code == 400
    assert getattr(p, "disagg_kv_sender", None) is None
    decode_add = dmod.DecodePreallocQueue.add._kvshield_original

    def newer_decode_add(self, req, is_retracted=False, is_rebootstrap=False):
        if is_aborted(req):
            prepare_abort(req, "rejected before prealloc", status_code=400)
            self.scheduler.output_streamer.stream_output([req], req.return_logprob)
            return
        return decode_add(self, req, is_retracted, is_rebootstrap)

    hooked = disagg._wrap_decode_add(newer_decode_add)  # kvshield's hook over the newer shape
    before = w.da.available_size()
    d.set_finish_with_abort("Input length exceeds the maximum allowed length")
    hooked(w.pre, d)
    preallocated, failed = w.pre.pop_preallocated()
    assert w.pre.queue == [] and preallocated == [] and d in w.streamed and d.finished_reason.status_code == 400
    assert w.da.available_size() == before and not w.decode.has_reservation(d)


def decode_refused_duplicate_keeps_first(kind):
    """Tenant t1's request R1 is live on the decode server (preallocated, waiting for its transfer) on bootstrap
    room X. A second request on room X arrives (``kind``: "room", another tenant's request on the same room, refused
    400 for the room; "oversized", a request on room X longer than the limit, refused 400 for its size). The decode
    server refuses it, and the refusal must leave R1 alone: R1's transfer then completes and R1 decodes over exactly
    the KV prefill computed for it (design note: the room check exists so a second request never disturbs the first)."""
    w = World(f"a4-dup-{kind}", prefill_limit=16, decode_limit=16)  # kvshield's limit, under SGLang's
    p, d = w.req("r1", 10)
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    preallocated, _ = w.decode_request(d)
    assert [x.req for x in preallocated] == [d]
    if kind != "control":  # control: no second request (the same steps decode R1)
        n = 10 if kind == "room" else w.decode.effective_limit() + 1
        d2 = Req(f"{w.tag}-intruder", n, "t2", d.bootstrap_room)
        pre2, failed2 = w.decode_request(d2)
        assert pre2 == [] and [x.req for x in failed2] == [d2], (pre2, failed2, d2.finished_reason)
        assert d2.finished_reason.status_code == 400, d2.finished_reason.to_json()
    w.send(d, 3)
    view = w.client_view(d, w.tq.pop_transferred())
    assert view[0] == 200, (f"the legitimate request R1 was aborted ({view[:2]}: "
                            f"{getattr(d.finished_reason, 'message', None)!r}) after another request on its room was refused")
    assert_safe(view, expected)


def fake_host_on_live_room(twin=False):
    """Tenant t1's request R is live on bootstrap room X (prefilled, preallocated on decode, its transfer under
    way). Tenant t2's client sends a request naming SGLang's fake bootstrap host (a no-transfer request, which
    kvshield exempts from the room check) and room X to the same prefill server. It must not disturb R: R's
    transfer completes and R decodes exactly its own KV."""
    w = World(f"a4-fakehost-{twin}")
    p, d = w.req("r1", 10)
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    preallocated, _ = w.decode_request(d)
    assert [x.req for x in preallocated] == [d]
    if not twin:  # twin: no intruder (the same steps decode R)
        intruder = Req(f"{w.tag}-t2", 4, "t2", d.bootstrap_room, host=FAKE_BOOTSTRAP_HOST)
        w.pq.add(intruder, 1)
        assert intruder in w.pq.queue or intruder.finished_reason is not None
    w.send(d, 3)
    view = w.client_view(d, w.tq.pop_transferred())
    assert view[0] == 200, (f"R was aborted ({view[:2]}: {getattr(d.finished_reason, 'message', None)!r}) after a "
                            "fake-bootstrap-host request of another tenant named its room")
    assert_safe(view, expected)


def decode_quota(quota_pages):
    """Tenant t1 has a page quota on the decode server (``TenantPolicy.withQuota``). README: a quota is "a per-request
    outcome, never a failed batch allocation (SGLang's allocation.py raises on None)"; an admitted request's worst
    case (its input plus ``max_new_tokens``) is reserved. Request R: 12 tokens, max_new_tokens 4 (worst case 16
    tokens, 4 pages). The decode server either refuses R at admission (its worst case exceeds the quota) or, having
    admitted it, can allocate its decode tokens: SGLang's ``alloc_for_decode`` raises "Decode out of memory" for the
    whole running batch (every tenant) when the allocator answers None."""
    import jpype
    from sglang.srt.mem_cache import common

    w = World(f"a4-dquota-{quota_pages}")
    policy = jpype.JClass("dev.kvshield.tenant.TenantPolicy")
    w.da._j.pool().tenants().register("t1", policy.withQuota(quota_pages))
    p, d = w.req("r", 12)
    assert d.sampling_params.max_new_tokens == 4
    expected = w.pkv.read(w.prefill_request(p, 100.0))
    preallocated, failed = w.decode_request(d)
    if not preallocated:  # refused at admission: a per-request outcome
        assert [x.req for x in failed] == [d] and 400 <= d.finished_reason.status_code < 600, d.finished_reason
        return
    w.send(d, 3)
    view = w.client_view(d, w.tq.pop_transferred())
    assert view[0] == 200, view[:2]
    assert_safe(view, expected)
    dslots = w.decode_slots(d)
    for pos in range(12, 16):  # R decodes its max_new_tokens: SGLang's alloc_decode, one token per step
        nxt = w.decode_token(d, pos, dslots[-1:])
        assert nxt is not None, (f"R was admitted on the decode server with tenant t1's quota of {quota_pages} pages, "
                                 f"but its decode token {pos + 1} cannot be allocated (t1 owns "
                                 f"{w.da.tenant_owned_pages('t1')} pages): SGLang's decode step raises for the batch")
        dslots = torch.cat([dslots, nxt.to(torch.int64)])
    common.release_kv_cache(d, w.tree)


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
    "meta/draft_not_carried/NONE": (meta_draft_not_carried, {"level": "NONE"}),
    "meta/draft_not_carried/ZERO": (meta_draft_not_carried, {"level": "ZERO"}),
    "meta/draft_not_carried/NONE/skips_check": (meta_draft_not_carried, {"level": "NONE", "twin": True}),
    "meta/incident": (meta_incident, {}),
    "meta/incident/accepts_partial": (meta_incident, {"twin": AcceptsPartialCoverage}),
    "meta/stale_row": (meta_stale_row, {}),
    "meta/stale_row/skips_clearing": (meta_stale_row, {"adapter": SkipsClearingTheRow()}),
    "meta/late_write": (meta_late_write, {}),
    "meta/limit_mismatch": (meta_limit_mismatch, {}),
    "meta/limit_mismatch/skips_check": (meta_limit_mismatch, {"twin": SkipsLimitCheck}),
    "meta/cross_tenant": (meta_cross_tenant, {}),
    "meta/shared_room": (meta_shared_room, {}),
    "meta/shared_room/skips_check": (meta_shared_room, {"twin": True}),
    "meta/decode_shared_room": (decode_shared_room, {}),
    "meta/cross_tenant/skips_check": (meta_cross_tenant, {"twin": True}),
    "meta/drained_abort": (meta_drained_abort, {}),
    "meta/drained_abort/two_ranks": (meta_drained_abort, {"acks": 2, "prefill_ranks": 2}),
    "meta/drained_abort/one_of_two_acks": (meta_drained_abort, {"acks": 1, "prefill_ranks": 2}),
    "meta/drained_abort/no_ack": (meta_drained_abort, {"acks": 0}),
    "meta/drained_abort/no_ack/released_as_drained": (meta_drained_abort, {"acks": 0, "drained": lambda r, room: True}),
    "no_transfer": (no_transfer_levels, {}),
    "prefill_refuses": (prefill_refuses, {}),
    "at_the_limit": (at_the_limit, {}),
    "metadata_row": (metadata_row, {}),
    "newer_shape": (newer_sglang_rejects_before_the_handoff, {}),
    "no_transfer/admits_under_none": (no_transfer_levels, {"twin": AdmitsUnderNone}),
    "retracted_resumed": (retracted_and_resumed, {}),
    "retracted_resumed/plans_nothing": (retracted_and_resumed, {"twin": PlansNothingOnResume}),
    "retracted_resumed/reserves_again": (retracted_and_resumed, {"twin": ReservesOnResume}),
    "decode_quota/4": (decode_quota, {"quota_pages": 4}),
    "decode_quota/3": (decode_quota, {"quota_pages": 3}),
    "fake_host/control": (fake_host_on_live_room, {"twin": True}),
    "fake_host/intruder": (fake_host_on_live_room, {}),
    "decode_dup/control": (decode_refused_duplicate_keeps_first, {"kind": "control"}),
    "decode_dup/room": (decode_refused_duplicate_keeps_first, {"kind": "room"}),
    "decode_dup/oversized": (decode_refused_duplicate_keeps_first, {"kind": "oversized"}),
}


def run(table):
    """Reports ``table``'s scenarios (:func:`scenarios.report`) in this world's process setup."""
    plugin.load()
    wire.install()
    transport.register(wire.NicKVReceiver, NicTransport())
    servers.one_process_group()
    with servers.single_rank():
        # NOTE: a decode server's retraction backup as the scheduler world runs it (SGLang's per-request host copy)
        servers.publish_server_args(attention_backend="torch_native", disaggregation_decode_retraction_backup="cpu_tensor")
        scenarios.report(table)


def main():
    run(SCENARIOS)
