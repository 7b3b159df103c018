"""Prefill-side send scenarios through SGLang's own ``SchedulerDisaggregationPrefillMixin`` with kvshield's hooks
installed by the plug-in, run in a subprocess by ``test_disagg_prefill.py``: one prefill pool, SGLang's ``Req``,
``ReqToTokenPool``, ``ChunkCache`` (or kvshield's prefix cache), ``MetadataBuffers`` and their index allocator,
``release_kv_cache``; SGLang's ``process_prefill_chunk``, ``send_kv_chunk`` and ``process_disagg_prefill_inflight_queue``
(one rank, a one-process gloo group for the poll agreement); the last chunk as ``process_batch_result_disagg_prefill``
sends it. The transport (:class:`ReadingSender`, SGLang's fake sender) has a ``poll()`` the scenario controls and reads
the source pages' bytes straight from KV memory, as an RDMA engine does, at the page ids SGLang handed it.

Every oracle asserts on bytes the transport reads or on the pool's free space; its planted-bug twin (below, test
code only) must make it fail. ``main`` prints one ``RESULTS <json>`` line: scenario → [pass|fail, message].
"""

import gc
import os
import weakref
import zlib

import torch
from sglang.srt.disaggregation import prefill as pmod
from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.fake.conn import FakeKVSender
from sglang.srt.disaggregation.prefill import FINISH_LENGTH, SchedulerDisaggregationPrefillMixin, release_kv_cache
from sglang.srt.disaggregation.utils import MetadataBuffers, ReqToMetadataIdxAllocator, prepare_abort
from sglang.srt.managers.schedule_batch import FINISH_ABORT, ReqKvInfo, ScheduleBatch
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.chunk_cache import ChunkCache
from sglang.srt.mem_cache.common import maybe_cache_unfinished_req
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

import prefix_driver
import scenarios
import servers
from fakes import MHAPool
from kvshield_sglang import disagg, disagg_prefill, plugin, prefix_cache, transport
from kvshield_sglang.errors import HandoffError

SIZE, PAGE, CHUNK = 32, 4, 8  # 8 pages of 4 tokens; chunked prefill in 8-token chunks


class ReadingSender(FakeKVSender):
    """SGLang's fake sender whose ``poll()`` the scenario sets; ``read`` returns what it reads from the prefill
    KV memory at the page ids it was handed (no allocator in between: the wire reads memory)."""

    def __init__(self, kv, *a, **k):
        super().__init__(*a, **k)
        self.kv, self.pages, self.state = kv, [], KVPoll.WaitingForInput

    def send(self, page_indices, state_indices=None, num_kv_tokens=None):
        self.pages.extend(int(p) for p in page_indices)
        self.state = KVPoll.Transferring

    def poll(self):
        return self.state

    def abort(self):
        self.state = KVPoll.Failed

    def clear(self):
        pass

    def read(self, tokens):
        slots = (torch.tensor(self.pages)[:, None] * PAGE + torch.arange(PAGE)).reshape(-1)[:tokens]
        return self.kv.read(slots)


class _Grammar:
    """A grammar that rejects the sampled token: SGLang aborts the request."""

    def accept_token(self, token):
        raise ValueError(f"token {token} is not in the grammar")


class Scheduler(SchedulerDisaggregationPrefillMixin):
    """SGLang's prefill scheduler (the mixin's own methods) with the state they read; computes KV chunk by chunk
    (token i holds value + i)."""

    def __init__(self, sends_wrapper=None, engine=None):
        """``engine``: a :class:`prefix_driver.Engine` whose pool, rows and prefix cache the scheduler uses."""
        import sglang.srt.mem_cache.allocator.paged as paged  # kvshield's class, swapped in by the plug-in

        if engine is None:
            self.kv = MHAPool(SIZE, PAGE, layers=2)
            self.token_to_kv_pool_allocator = paged.PagedTokenToKVPoolAllocator(
                SIZE, PAGE, torch.float32, "cpu", self.kv, False,
                kvshield_settings={"level": "ZERO", "strict": True, "advertisedContextTokens": SIZE})
            self.req_to_token_pool = ReqToTokenPool(size=8, max_context_len=64, device="cpu", enable_memory_saver=False)
            self.tree_cache = ChunkCache(CacheInitParams(disable=True, req_to_token_pool=self.req_to_token_pool,
                                                         token_to_kv_pool_allocator=self.token_to_kv_pool_allocator,
                                                         page_size=PAGE))
        else:
            self.kv, self.token_to_kv_pool_allocator = engine.kv, engine.alloc
            self.req_to_token_pool, self.tree_cache = engine.rows, engine.cache
        if sends_wrapper is not None:
            self.token_to_kv_pool_allocator.kvshield_prefill_sends = sends_wrapper(
                disagg_prefill.PrefillSends(self.token_to_kv_pool_allocator), self)
        self.streamed = []
        state = servers.disagg_scheduler(self.token_to_kv_pool_allocator, "fake", self.streamed)
        for name in ("output_streamer", "metrics_reporter", "ps", "attn_cp_cpu_group", "attn_tp_cpu_group",
                     "disagg_prefill_inflight_queue", "disagg_prefill_pending_chunk_rids", "enable_staging",
                     "enable_overlap", "sliding_window_size", "server_args"):
            setattr(self, name, getattr(state, name))
        self.req_to_metadata_buffer_idx_allocator = ReqToMetadataIdxAllocator(4)
        self.disagg_metadata_buffers = MetadataBuffers(4, 4, torch.float32)
        self.disagg_prefill_bootstrap_queue = type("BootstrapQueue", (), {})()  # what send_kv_chunk reads of it
        self.disagg_prefill_bootstrap_queue.kv_manager = type("Manager", (), {})()
        self.disagg_prefill_bootstrap_queue.kv_manager.kv_args = type("Args", (), {"state_types": []})()
        self.chunked_req, self.running_batch = None, ScheduleBatch(reqs=[])

    @property
    def alloc(self):
        return self.token_to_kv_pool_allocator

    def request(self, rid, n, tenant="t1"):
        """SGLang's Req as the bootstrap queue hands it over (:meth:`attach`), with a ``req_to_token`` row."""
        req = servers.request(rid, list(range(n)), tenant)
        self.attach(req)
        self.req_to_token_pool.alloc([req])
        return req

    def attach(self, req):
        """What SGLang's bootstrap gives a request: bootstrap address and room, its sender, its metadata index."""
        req.bootstrap_host, req.bootstrap_port = "10.0.0.2", 8998
        req.bootstrap_room = zlib.crc32(req.rid.encode()) & 0xFFFF
        req.disagg_kv_sender = ReadingSender(self.kv, None, "10.0.0.2:8998", req.bootstrap_room, [0], 0)
        req.metadata_buffer_index = self.req_to_metadata_buffer_idx_allocator.alloc()
        return req

    def compute(self, req, upto, value):
        """The forward of ``req``'s tokens from its extend end to ``upto``: pages allocated for the request (its
        plan row names it), KV written, the row filled, as ``alloc_for_extend`` leaves them."""
        start = 0 if req.extend_range is None else req.extend_range.end
        self.alloc.set_plan([(req, req.kvshield_tenant or "default", start, upto)])  # a request is its Req object
        slots = self.alloc.alloc(-(-(upto - start) // PAGE) * PAGE)[: upto - start]
        self.alloc.clear_plan()
        for b in self.kv.buffers():
            b[slots] = (value + torch.arange(start, upto, dtype=torch.float32))[:, None, None]
        self.req_to_token_pool.req_to_token[req.req_pool_idx, start:upto] = slots.to(torch.int32)
        req.set_extend_range(start, upto)
        req.kv_committed_len = upto
        req.kv = ReqKvInfo(kv_allocated_len=upto, swa_evicted_seqlen=0)

    def last_chunk(self, req, grammar=None):
        """What ``process_batch_result_disagg_prefill`` does with a finished prefill (its model-output bookkeeping
        aside): the sampled token appended, the request cached and put in the inflight queue, its last chunk
        sent, and a grammar that rejects the token aborting it."""
        req.output_ids.append(7)
        maybe_cache_unfinished_req(req, self.tree_cache)
        self.disagg_prefill_inflight_queue.append(req)
        self.send_kv_chunk(req, last_chunk=True)
        if grammar is not None:
            try:
                grammar.accept_token(7)
            except ValueError as e:
                prepare_abort(req, f"Grammar accept_token failed for req {req.rid}: {e}", status_code=500)

    def prefill(self, req, value, grammar=None):
        """Chunked prefill of ``req``: each non-last chunk is sent by SGLang's ``process_prefill_chunk``, the last as
        :meth:`last_chunk`; a grammar rejection then releases the request's KV at once (SGLang's abort path)."""
        n = len(req.origin_input_ids)
        for upto in range(CHUNK, n, CHUNK):
            self.compute(req, upto, value)
            self.chunked_req = req
            self.process_prefill_chunk(None, self.running_batch)
        self.chunked_req = None
        self.compute(req, n, value)
        self.last_chunk(req, grammar)
        if isinstance(req.finished_reason, FINISH_ABORT):
            self.release_early(req)

    def release_early(self, req):
        """A release before the transfer concluded: the request's KV released and the request finished (out of
        the inflight queue, its metadata index back), as SGLang's failure handling does, while the transport may
        still read its pages."""
        release_kv_cache(req, self.tree_cache)
        self.disagg_prefill_inflight_queue.remove(req)
        self.output_streamer.stream_output([req], req.return_logprob)
        pmod.maybe_release_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)

    def expected(self, req, value):
        n = len(req.origin_input_ids)
        return (value + torch.arange(n, dtype=torch.float32))[None, :, None, None].expand(4, n, 1, 4)

    def pages_of(self, req):
        return set(req.disagg_kv_sender.pages)

    def bootstrap(self, req):
        """What the hooked bootstrap queue does before any chunk: the sender armed to publish coverage
        (:func:`transport.arm_sender`), then SGLang's ``init`` with the metadata row. Returns the rows."""
        assert transport.arm_sender(req.disagg_kv_sender, req, self.disagg_metadata_buffers, PAGE, SIZE,
                                    tenant=disagg._tenant_of(req), carried=len(self.kv.buffers()))
        req.disagg_kv_sender.init(-(-len(req.origin_input_ids) // PAGE), req.metadata_buffer_index)
        return self.disagg_metadata_buffers.kvshield_coverage

    def share_prefix(self, req, holder, tokens):
        """A stock radix-cache hit: ``req``'s row starts with ``holder``'s first ``tokens`` slots, protected (the
        cache's, not the request's to free)."""
        rows = self.req_to_token_pool.req_to_token
        rows[req.req_pool_idx, :tokens] = rows[holder.req_pool_idx, :tokens]
        req.set_extend_range(0, tokens)
        req.cache_protected_len = tokens

    def row_slots(self, req, start, end):
        return self.req_to_token_pool.req_to_token[req.req_pool_idx, start:end].to(torch.int64)

    def step(self):
        self.alloc.end_step()

    def check_no_host_sync(self):
        assert self.alloc.host_syncs() == 0, f"the allocator synced {self.alloc.host_syncs()} times"


def _sends(s):
    return disagg_prefill.sends_of(s)


# ---------------------------------------------------------------- planted bugs (test code only)

class _Wrapper:
    def __init__(self, real, scheduler):
        self.real, self.scheduler = real, scheduler

    def __getattr__(self, name):
        return getattr(self.real, name)


class ReleasesWithoutClaims(_Wrapper):
    """Planted bug: sends are recorded but no page is claimed, so SGLang's early release frees them."""

    def claim(self, rid, page_indices):
        return 0

    def mark_sent(self, rid, tokens):
        pass


class FreesOnTimeout(_Wrapper):
    """Planted bug: an overdue send's claims are dropped (its pages freed) instead of fenced."""

    def expire(self, rid):
        self.real.complete(rid)


class KeepsClaims(_Wrapper):
    """Planted bug: a concluded transfer's claims are never dropped."""

    def complete(self, rid):
        self.real.sends.pop(rid, None)


class SendsUnclaimed(_Wrapper):
    """Planted bug: a refused claim is logged and the chunk handed to the transport anyway."""

    def claim(self, rid, page_indices):
        try:
            return self.real.claim(rid, page_indices)
        except HandoffError:
            return 0

    def mark_sent(self, rid, tokens):
        pass


class ClaimsOwnPagesOnly(_Wrapper):
    """Planted bug: only the pages the request allocated itself are claimed; its prefix pages are sent unclaimed."""

    def claim(self, rid, page_indices):
        alloc = self.scheduler.alloc
        own = [p for p in page_indices if alloc._j.requestOf(int(p)) == alloc.request_id(rid)]
        return self.real.claim(rid, own)

    def mark_sent(self, rid, tokens):
        pass


class SkipsTenantCheck(_Wrapper):
    """Planted bug: pages of another tenant are left out of the claim instead of refusing the chunk."""

    def claim(self, rid, page_indices):
        alloc = self.scheduler.alloc
        tenant = alloc.tenant_id(self.real.sends[rid].req.kvshield_tenant)
        return self.real.claim(rid, [p for p in page_indices if alloc._j.tenantOf(int(p)) == tenant])

    def mark_sent(self, rid, tokens):
        pass


def judges_by_coverage(scheduler):
    """Planted bug: a refusal takes "nothing handed over" from the coverage marked once a whole chunk returned."""
    del scheduler
    original = disagg_prefill._refuse

    def refuse(sends, req, error):
        send = sends.sends.get(req)
        if send is not None and sends.sent_tokens(req) == 0:
            send.last_sent_at = None
        original(sends, req, error)

    disagg_prefill._refuse = refuse
    return original


# ---------------------------------------------------------------- scenarios

def aborted_mid_transfer(twin=None):
    """A is aborted (its grammar rejects the token) right after its last chunk went to the transport:
    SGLang releases its KV at once, B allocates everything free, and the transport, still reading,
    reads A's bytes until it concludes; then A's pages are scrubbed and reused."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    a = s.request("a", 12)
    s.prefill(a, 100.0, grammar=_Grammar())
    assert isinstance(a.finished_reason, FINISH_ABORT) and s.disagg_prefill_inflight_queue == []
    s.step()
    b = s.request("b", s.alloc.available_size(), tenant="t2")  # everything the pool can hand out now
    s.compute(b, len(b.origin_input_ids), 500.0)
    s.process_disagg_prefill_inflight_queue()  # the transport still transfers: A stays
    s.step()
    seen = a.disagg_kv_sender.read(12)
    assert torch.equal(seen, s.expected(a, 100.0)), f"the transfer of aborted A read other bytes: {seen[0, :, 0, 0].tolist()}"
    a_pages = s.pages_of(a)
    b_pages = {int(p) // PAGE for p in s.row_slots(b, 0, b.extend_range.end).tolist()}
    assert not a_pages & b_pages, f"B got A's claimed pages {sorted(a_pages & b_pages)}"
    a.disagg_kv_sender.state = KVPoll.Failed  # the transport drained
    s.process_disagg_prefill_inflight_queue()
    s.step()
    assert not _sends(s).has_send(a) and _sends(s).active() == 0
    assert torch.count_nonzero(a.disagg_kv_sender.read(12)) == 0, "A's pages were not scrubbed once the transfer concluded"
    c = s.request("c", s.alloc.available_size(), tenant="t3")
    s.compute(c, len(c.origin_input_ids), 900.0)
    c_pages = {int(p) // PAGE for p in s.row_slots(c, 0, c.extend_range.end).tolist()}
    assert a_pages <= c_pages, f"A's pages {sorted(a_pages)} did not return to circulation: C got {sorted(c_pages)}"
    s.check_no_host_sync()


def never_concludes(twin=None):
    """A's transport never concludes: past the deadline the send expires (alarm, A aborted with 500 and
    released), A's pages stay out of circulation (``available_size()`` shows it) while the transport
    may still read them; a late conclusion gives them back."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "0"
    s = Scheduler(twin)
    full = s.alloc.available_size()
    a = s.request("a", 10)
    s.prefill(a, 100.0)
    s.process_disagg_prefill_inflight_queue()  # the deadline (0 s) passed: expired
    s.step()
    sends, held = _sends(s), len(s.pages_of(a)) * PAGE
    assert s.alloc.available_size() == full - held, f"expired pages returned to circulation: {s.alloc.available_size()} of {full}"
    assert len(sends.alarms()) == 1 and "never concluded" in sends.alarms()[0], sends.alarms()
    assert a.finished_reason.status_code == 500 and a in s.streamed and not s.disagg_prefill_inflight_queue
    assert s.req_to_metadata_buffer_idx_allocator.available_size() == 4 and a.metadata_buffer_index == -1
    b = s.request("b", s.alloc.available_size(), tenant="t2")
    s.compute(b, len(b.origin_input_ids), 500.0)
    assert torch.equal(a.disagg_kv_sender.read(10), s.expected(a, 100.0)), "the overdue transfer read other bytes"
    a.disagg_kv_sender.state = KVPoll.Success  # late: the transport drained after all
    s.process_disagg_prefill_inflight_queue()
    disagg_prefill.sweep(s, sends)
    s.step()
    assert sends.active() == 0 and s.alloc.available_size() == held, (sends.active(), s.alloc.available_size(), held)
    s.check_no_host_sync()


def completes(twin=None):
    """A normal chunked transfer: claims grow per chunk, the sender's Success drops them after SGLang's
    release, and the pages are scrubbed and free again."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    full = s.alloc.available_size()
    a = s.request("a", 20)
    n = len(a.origin_input_ids)
    s.compute(a, CHUNK, 100.0)
    s.chunked_req = a
    s.process_prefill_chunk(None, s.running_batch)
    assert _sends(s).claimed_pages(a) == 2 and _sends(s).sent_tokens(a) == CHUNK
    s.chunked_req = None
    s.compute(a, n, 100.0)
    s.last_chunk(a)
    assert _sends(s).claimed_pages(a) == 5 and _sends(s).sent_tokens(a) == n
    assert torch.equal(a.disagg_kv_sender.read(n), s.expected(a, 100.0))
    a.disagg_kv_sender.state = KVPoll.Success
    done = s.process_disagg_prefill_inflight_queue()
    s.step()
    assert done == [a] and isinstance(a.finished_reason, FINISH_LENGTH)
    assert s.alloc.available_size() == full, f"a completed transfer's pages were not freed: {s.alloc.available_size()} of {full}"
    assert torch.count_nonzero(a.disagg_kv_sender.read(n)) == 0, "freed pages were not scrubbed"
    s.check_no_host_sync()


def completes_before_release(twin=None):
    """A pipeline-parallel rank: its transport concluded, but SGLang releases only once the previous rank
    agrees (``rids_to_check``). The claims drop at once; the pages stay A's, bytes intact, until SGLang's
    release, which then frees them scrubbed."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    full = s.alloc.available_size()
    a = s.request("a", 10)
    s.prefill(a, 100.0)
    a.disagg_kv_sender.state = KVPoll.Success
    assert s.process_disagg_prefill_inflight_queue(rids_to_check=[]) == [] and s.disagg_prefill_inflight_queue == [a]
    s.step()
    assert torch.equal(a.disagg_kv_sender.read(10), s.expected(a, 100.0)), "A's pages changed before SGLang released them"
    assert s.alloc.available_size() == full - 3 * PAGE, s.alloc.available_size()
    assert s.process_disagg_prefill_inflight_queue(rids_to_check=[a.rid]) == [a]
    s.step()
    assert s.alloc.available_size() == full, f"a completed transfer's pages were not freed: {s.alloc.available_size()} of {full}"
    assert torch.count_nonzero(a.disagg_kv_sender.read(10)) == 0, "freed pages were not scrubbed"
    s.check_no_host_sync()


def refused_claim(twin=None):
    """Chunks kvshield cannot claim never reach the transport and the client sees the error: A carries no
    tenant (refused at its first chunk); B's last page left it before its last chunk (SGLang freed it),
    so that chunk is refused while the one already handed over stays claimed until the sender concludes."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    full = s.alloc.available_size()
    a = s.request("a", 6, tenant=None)  # a Req built where the scheduler hook never stamped it
    s.compute(a, 6, 1.0)
    s.last_chunk(a)
    assert a.disagg_kv_sender.pages == [] and a.finished_reason.status_code == 500, a.finished_reason.to_json()
    assert "no kvshield tenant" in a.finished_reason.message
    b = s.request("b", 12)
    s.compute(b, CHUNK, 2.0)
    s.chunked_req = b
    s.process_prefill_chunk(None, s.running_batch)
    s.chunked_req = None
    s.compute(b, 12, 2.0)
    with s.alloc.releasing(b.kvshield_tenant, b):  # SGLang frees B's last page (B's own hold)
        s.alloc.free(s.row_slots(b, CHUNK, 12))
    b.kv_committed_len = b.kv.kv_allocated_len = CHUNK
    s.last_chunk(b)
    assert len(b.disagg_kv_sender.pages) == 2, f"a refused chunk reached the transport: pages {b.disagg_kv_sender.pages}"
    assert b.finished_reason.status_code == 500 and "not allocated now" in b.finished_reason.message, b.finished_reason.to_json()
    s.process_disagg_prefill_inflight_queue()
    s.step()
    assert a in s.streamed and b in s.streamed and not s.disagg_prefill_inflight_queue and _sends(s).active() == 0
    assert s.alloc.available_size() == full, (s.alloc.available_size(), full)


def staged_refusal_after_a_handed_segment(twin=None):
    """SGLang's staging transfer (``SGLANG_DISAGG_STAGING_BUFFER=1``, its buffers an accepted gap) sends a chunk in
    grid segments, one ``send`` each: A's only chunk hands over its first page (segment 1), then segment 2 is refused
    (A's second page left it: SGLang freed it). The page handed over stays claimed until A's sender, aborted,
    concludes: SGLang's release of A does not put it back while the transport may still read it, so B (tenant t2)
    never gets it and the transport reads A's bytes. (It was judged by the coverage marked after the whole chunk:
    none yet, so the claims dropped with the first segment in the transport's hands.)"""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    servers.publish_server_args(attention_backend="torch_native", chunked_prefill_size=PAGE)  # one page a segment
    try:
        s = Scheduler()
        s.enable_staging = True
        restore = twin(s) if twin is not None else None
        a = s.request("a", 2 * PAGE)
        s.compute(a, 2 * PAGE, 100.0)
        a.disagg_kv_sender.abort = lambda: None  # an abort the transport concludes later (poll stays Transferring)
        with s.alloc.releasing(a.kvshield_tenant, a):  # SGLang frees A's second page before its chunk goes
            s.alloc.free(s.row_slots(a, PAGE, 2 * PAGE))
        a.kv_committed_len = a.kv.kv_allocated_len = PAGE
        s.last_chunk(a)
        assert len(a.disagg_kv_sender.pages) == 1 and a.finished_reason.status_code == 500, a.finished_reason.to_json()
        s.process_disagg_prefill_inflight_queue()  # SGLang releases the aborted A
        s.step()
        b = s.request("b", s.alloc.available_size(), tenant="t2")  # everything the pool hands out now
        s.compute(b, len(b.origin_input_ids), 500.0)
        assert torch.equal(a.disagg_kv_sender.read(PAGE), s.expected(a, 100.0)[:, :PAGE]), (
            f"the transport read {a.disagg_kv_sender.read(PAGE)[0, :, 0, 0].tolist()} from A's page handed over")
        a.disagg_kv_sender.state = KVPoll.Failed  # the abort concluded: the transport reads no more
        s.process_disagg_prefill_inflight_queue()
        s.step()
        assert _sends(s).active() == 0 and s.alloc.available_size() == PAGE, s.alloc.available_size()
    finally:
        if twin is not None:
            disagg_prefill._refuse = restore
        servers.publish_server_args(attention_backend="torch_native")


def _cache_engine():
    return prefix_driver.Engine(lambda params, shared: prefix_cache.KvShieldPrefixCache(params, shared), size=SIZE, page=PAGE)


def _hit_the_cached_prefix(engine, s):
    """W's 8-token prompt is computed and cached (2 pages, the cache namespace's); A (12 tokens, same tenant)
    hits it and computes its last page; its sender is armed. Returns A and its coverage rows."""
    prompt = list(range(1, 9))
    assert engine.run(prefix_driver.Req("w", "t1", prompt)) is not None
    a = s.attach(prefix_driver.Req("a", "t1", prompt + [9, 10, 11, 12]))
    engine.admit(a)
    assert a.matched_tokens == 8, a.matched_tokens
    a.kv, a.kv_committed_len = ReqKvInfo(kv_allocated_len=12, swa_evicted_seqlen=0), 12
    cached = [int(p) for p in engine.rows.req_to_token[a.req_pool_idx, 0:8:PAGE].as_subclass(torch.Tensor) // PAGE]
    assert all(s.alloc._j.requestOf(p) < 0 and str(s.alloc._j.pool().view().stateOf(p)) == "OWNED" for p in cached), \
        "the prefix is not the cache's"
    return a, cached, s.bootstrap(a)


def prefix_cache_hit_completes(twin=None):
    """A's prompt hit the kvshield prefix cache: its send claims the cached pages with its own, the transport
    reads the exact bytes and the coverage row says 12 tokens; on Success SGLang's release hands A's pages to
    the cache, the claims drop, and every page of the path is evictable, then free."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    engine = _cache_engine()
    s = Scheduler(twin, engine)
    full = s.alloc.available_size()
    a, cached, coverage = _hit_the_cached_prefix(engine, s)
    reads = prefix_driver.RowReads.reads
    s.last_chunk(a)
    assert set(cached) <= s.pages_of(a) and len(s.pages_of(a)) == 3, (cached, a.disagg_kv_sender.pages)
    assert _sends(s).claimed_pages(a) == 3 and _sends(s).sent_tokens(a) == 12
    assert coverage[0, :3].tolist() == [transport.ROW_MAGIC, a.bootstrap_room, 12], coverage[0]
    assert torch.equal(a.disagg_kv_sender.read(12), engine.expected("t1", a.origin_input_ids)), "the transfer read other bytes"
    a.disagg_kv_sender.state = KVPoll.Success
    assert s.process_disagg_prefill_inflight_queue() == [a]
    s.step()
    assert engine.cache.evictable_size() == 3 * PAGE, f"the path is not evictable: {engine.cache.evictable_size()} tokens"
    engine.cache.evict(EvictParams(num_tokens=3 * PAGE))
    s.step()
    assert s.alloc.available_size() == full, f"the cached pages were not freed: {s.alloc.available_size()} of {full}"
    assert _sends(s).active() == 0
    assert s.alloc.host_syncs() == 0 and prefix_driver.RowReads.reads - reads == 1, (s.alloc.host_syncs(), prefix_driver.RowReads.reads - reads)


def prefix_cache_evicted_mid_transfer(twin=None):
    """A's prompt hit the kvshield prefix cache and A is aborted right after its last chunk went out: its
    release hands its pages to the cache, the cache evicts every unlocked page and another tenant's request
    takes every free page while the transport reads. The claimed prefix stays quarantined: the transport
    reads A's bytes; on Success the claims drop and the evicted pages are scrubbed and free."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    engine = _cache_engine()
    s = Scheduler(twin, engine)
    a, _, _ = _hit_the_cached_prefix(engine, s)
    s.last_chunk(a, _Grammar())
    s.release_early(a)  # the cache takes A's pages, its lock goes
    assert isinstance(a.finished_reason, FINISH_ABORT) and engine.cache.evictable_size() == 3 * PAGE
    engine.cache.evict(EvictParams(num_tokens=3 * PAGE))
    s.step()
    b = prefix_driver.Req("b", "t2", [50 + i for i in range(s.alloc.available_size())])
    assert engine.admit(b) is not None
    assert torch.equal(a.disagg_kv_sender.read(12), engine.expected("t1", a.origin_input_ids)), "the transfer read other bytes"
    a.disagg_kv_sender.state = KVPoll.Success
    s.process_disagg_prefill_inflight_queue()
    s.step()
    assert _sends(s).active() == 0 and s.alloc.available_size() == 3 * PAGE, s.alloc.available_size()
    assert torch.count_nonzero(a.disagg_kv_sender.read(12)) == 0, "evicted pages were not scrubbed"


def stock_prefix_hit(twin=None):
    """SGLang's stock radix cache: A's prompt hits the prefix E computed, so A's row starts with E's pages.
    A's send claims them with its own; A is aborted after its last chunk went out, the cache evicts E's and
    A's pages (freed) and another tenant's request takes every free page: the transport reads A's bytes;
    on Success the claims drop and the pages are scrubbed and free."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    e = s.request("e", 8)
    s.compute(e, 8, 100.0)
    s.alloc.cache_took(e, e.kvshield_tenant)  # the radix tree took E's prefix: the cache's holds now (the plug-in's adoption)
    a = s.request("a", 12)
    s.share_prefix(a, e, 8)
    s.compute(a, 12, 100.0)
    s.last_chunk(a, _Grammar())
    s.release_early(a)  # A's own page freed, the cached prefix kept
    assert len(s.pages_of(a)) == 3, a.disagg_kv_sender.pages
    with s.alloc.evicting():  # the tree evicts the prefix (E's pages, the cache's holds)
        s.alloc.free(s.row_slots(e, 0, 8))
    s.step()
    b = s.request("b", s.alloc.available_size(), tenant="t2")
    s.compute(b, len(b.origin_input_ids), 500.0)
    assert torch.equal(a.disagg_kv_sender.read(12), s.expected(a, 100.0)), "the transfer read other bytes"
    assert _sends(s).claimed_pages(a) == 3
    a.disagg_kv_sender.state = KVPoll.Success
    s.process_disagg_prefill_inflight_queue()
    s.step()
    assert _sends(s).active() == 0 and s.alloc.available_size() == 3 * PAGE, s.alloc.available_size()
    assert torch.count_nonzero(a.disagg_kv_sender.read(12)) == 0, "freed pages were not scrubbed"
    s.check_no_host_sync()


def foreign_page(twin=None):
    """A's row holds a page of another tenant: its chunk is refused (500, naming the page, its tenant and the
    request); neither the coverage row nor the transport gets anything, and nothing stays claimed."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    full = s.alloc.available_size()
    o = s.request("o", 4, tenant="t2")
    s.compute(o, 4, 900.0)
    a = s.request("a", 8)
    s.share_prefix(a, o, 4)
    s.compute(a, 8, 100.0)
    coverage = s.bootstrap(a)
    s.last_chunk(a)
    assert a.disagg_kv_sender.pages == [], f"a page of another tenant reached the transport: {a.disagg_kv_sender.pages}"
    page = int(s.row_slots(o, 0, 1)) // PAGE
    message = a.finished_reason.message
    assert a.finished_reason.status_code == 500 and f"page {page} of tenant {s.alloc.tenant_id('t2')}" in message \
        and f"request {s.alloc.request_id(a)}" in message, message
    assert torch.count_nonzero(coverage) == 0, "a refused chunk wrote the coverage row"
    a.disagg_kv_sender.send([page])  # a later send on a refused request's sender is dropped too
    assert a.disagg_kv_sender.pages == [], f"a send after the refusal reached the transport: {a.disagg_kv_sender.pages}"
    s.process_disagg_prefill_inflight_queue()  # A's release gives back its own page; O's stays O's
    s.step()
    assert a in s.streamed and _sends(s).active() == 0 and s.alloc.available_size() == full - PAGE, s.alloc.available_size()
    assert s.alloc.page_owner(page)[0] == "t2", s.alloc.page_owner(page)


def _conclude(s, a, path):
    """Request A (tenant t1, its room claimed as create_sender's hook does) goes through prefill and concludes by
    ``path``: "success" (its sender reports Success), "foreign_page" (kvshield refuses its chunk: a page of tenant t2
    in its row; aborted 500), "expired" (its sender never concluded within the deadline: aborted 500, and the
    transport drains later). Returns A's room."""
    if path == "foreign_page":
        o = s.request("o", 4, tenant="t2")
        s.compute(o, 4, 900.0)
    a.bootstrap_room = {"success": 4242, "foreign_page": 4243, "expired": 4244}[path]  # B keeps it afterwards
    disagg.PREFILL_ROOMS.claim(a)
    if path == "foreign_page":
        s.share_prefix(a, o, 4)
    s.compute(a, 8, 100.0)
    s.bootstrap(a)
    s.last_chunk(a)
    if path == "success":
        a.disagg_kv_sender.state = KVPoll.Success
        assert s.process_disagg_prefill_inflight_queue() == [a]
    elif path == "foreign_page":
        assert a.finished_reason.status_code == 500, a.finished_reason.to_json()
        s.process_disagg_prefill_inflight_queue()
    else:
        s.process_disagg_prefill_inflight_queue()  # deadline 0 s: expired, aborted, out of SGLang's queue
        assert a.finished_reason.status_code == 500, a.finished_reason
        a.disagg_kv_sender.state = KVPoll.Success  # the transport drains: the sender concluded
        disagg_prefill.sweep(s, _sends(s))
    s.step()
    assert not s.disagg_prefill_inflight_queue and _sends(s).active() == 0 and not _sends(s).has_send(a)
    return a.bootstrap_room


def room_free_after_conclusion(path):
    """README/disagg.py: a prefill server refuses a request on a room "another live request of this server holds;
    the room is free once the first one's sender concluded". After request A concluded (every path: Success, a
    refused claim, an expired send drained) and SGLang dropped it (streamed, out of every queue), a client request
    B on A's room must be admitted, on every rank alike: the decision may not depend on when Python's cyclic
    garbage collector last ran on that rank."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "0" if path == "expired" else "60"
    was = gc.isenabled()
    gc.collect()
    gc.disable()  # a rank whose collector has not run since (its timing is per process)
    try:
        s = Scheduler()
        a = s.request("a", 8)
        room = _conclude(s, a, path)
        s.streamed.clear()  # SGLang's streamer keeps no request
        alive = weakref.ref(a)
        del a
        b = s.request("b", 8)
        b.bootstrap_room = room
        try:
            disagg.PREFILL_ROOMS.claim(b)
            admitted = True
        except HandoffError as e:
            admitted, why = False, str(e)
        held = alive() is not None
        gc.collect()
        gone = alive() is None
        assert admitted, (f"B refused on room {room} after A concluded ({path}): {why!r}; A's Req still alive only as "
                          f"cyclic garbage: {held and gone} (a rank whose collector ran admits B, one whose did not refuses it)")
    finally:
        if was:
            gc.enable()


SCENARIOS = {
    "aborted": (aborted_mid_transfer, {}),
    "aborted/releases_without_claims": (aborted_mid_transfer, {"twin": ReleasesWithoutClaims}),
    "never_concludes": (never_concludes, {}),
    "never_concludes/frees_on_timeout": (never_concludes, {"twin": FreesOnTimeout}),
    "completes": (completes, {}),
    "completes/keeps_claims": (completes, {"twin": KeepsClaims}),
    "completes_before_release": (completes_before_release, {}),
    "completes_before_release/keeps_claims": (completes_before_release, {"twin": KeepsClaims}),
    "refused_claim": (refused_claim, {}),
    "refused_claim/sends_unclaimed": (refused_claim, {"twin": SendsUnclaimed}),
    "staged_refusal": (staged_refusal_after_a_handed_segment, {}),
    "staged_refusal/judges_by_coverage": (staged_refusal_after_a_handed_segment, {"twin": judges_by_coverage}),
    "prefix_cache_hit_completes": (prefix_cache_hit_completes, {}),
    "prefix_cache_hit_completes/keeps_claims": (prefix_cache_hit_completes, {"twin": KeepsClaims}),
    "prefix_cache_evicted_mid_transfer": (prefix_cache_evicted_mid_transfer, {}),
    "prefix_cache_evicted_mid_transfer/claims_own_pages_only": (prefix_cache_evicted_mid_transfer, {"twin": ClaimsOwnPagesOnly}),
    "stock_prefix_hit": (stock_prefix_hit, {}),
    "stock_prefix_hit/claims_own_pages_only": (stock_prefix_hit, {"twin": ClaimsOwnPagesOnly}),
    "foreign_page": (foreign_page, {}),
    "foreign_page/skips_tenant_check": (foreign_page, {"twin": SkipsTenantCheck}),
    "room_free/success": (room_free_after_conclusion, {"path": "success"}),
    "room_free/foreign_page": (room_free_after_conclusion, {"path": "foreign_page"}),
    "room_free/expired": (room_free_after_conclusion, {"path": "expired"}),
}


def main():
    plugin.load()
    servers.one_process_group()
    with servers.single_rank():
        servers.publish_server_args(attention_backend="torch_native")
        scenarios.report(SCENARIOS)
