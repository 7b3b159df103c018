"""Prefill-side send scenarios through the hooked ``SchedulerDisaggregationPrefillMixin`` of the SGLang
stand-in (tests/stub_sglang), run in a subprocess by ``test_disagg_prefill.py``: one prefill pool, SGLang's
chunked ``send_kv_chunk``, ``process_batch_result_disagg_prefill`` and the inflight queue's poll loop,
and a transport (:class:`ReadingSender`) whose ``poll()`` the scenario controls and which reads the
source pages' bytes straight from KV memory, as an RDMA engine does, at the page ids SGLang handed it.

Every oracle asserts on bytes the transport reads or on the pool's free space; its planted-bug twin (below,
test code only) must make it fail. ``main`` prints one ``RESULTS <json>`` line: scenario → [pass|fail, message].
"""

import os
import types
import zlib

import torch

import prefix_driver
import scenarios
from fakes import DeviceOnlyTensor, MHAPool
from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.prefill import FINISH_LENGTH, SchedulerDisaggregationPrefillMixin
from sglang.srt.disaggregation.utils import FINISH_ABORT, MetadataBuffers

from kvshield_sglang import disagg_prefill, prefix_cache, transport
from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
from kvshield_sglang.errors import HandoffError

SIZE, PAGE, CHUNK = 32, 4, 8  # 8 pages of 4 tokens; chunked prefill in 8-token chunks


class DeviceRows:
    """SGLang's ``req_to_token`` on the device: a row slice's only host read is SGLang's own ``.cpu()``
    in ``send_kv_chunk``, counted in ``host_reads``; any other host access raises."""

    def __init__(self, rows, cols):
        self.t = torch.zeros(rows, cols, dtype=torch.int32)
        self.host_reads = 0

    def __getitem__(self, key):
        rows = self

        class _Row(DeviceOnlyTensor):
            def cpu(self):
                rows.host_reads += 1
                return self._t

        return _Row(self.t[key], torch.int32)


class ReqToTokenPool:
    def __init__(self):
        self.req_to_token, self._next = DeviceRows(8, 64), 0

    def alloc(self):
        self._next += 1
        return self._next - 1


class MetadataIdx:
    def __init__(self):
        self.freed = []

    def free(self, index):
        self.freed.append(index)


class ReadingSender:
    """A transport whose ``poll()`` the scenario sets; ``read`` returns what it reads from the prefill
    KV memory at the page ids it was handed (no allocator in between: the wire reads memory)."""

    def __init__(self, kv):
        self.kv, self.pages, self.state = kv, [], KVPoll.WaitingForInput

    def init(self, num_pages, aux_index=None):
        self.num_pages, self.aux_index = num_pages, aux_index

    def send(self, page_indices, state_indices=None):
        self.pages.extend(int(p) for p in page_indices)
        self.state = KVPoll.Transferring

    def poll(self):
        return self.state

    def abort(self):
        self.state = KVPoll.Failed

    def read(self, tokens):
        slots = (torch.tensor(self.pages)[:, None] * PAGE + torch.arange(PAGE)).reshape(-1)[:tokens]
        return self.kv.read(slots)


class Req:
    """The fields of SGLang's Req the prefill mixin reads."""

    def __init__(self, rid, n, tenant, rows, kv):
        self.rid, self.origin_input_ids, self.fill_ids, self.output_ids = rid, list(range(n)), [], []
        self.start_send_idx, self.is_chunked, self.grammar, self.return_logprob = 0, 0, None, False
        self.bootstrap_host, self.bootstrap_port, self.bootstrap_room = "10.0.0.2", 8998, zlib.crc32(rid.encode()) & 0xFFFF
        self.kvshield_tenant, self.finished_reason, self.metadata_buffer_index = tenant, None, 0
        self.kv_committed_len, self.tree_keeps = 0, False
        self.req_pool_idx, self.disagg_kv_sender, self._rows, self._held = rows.alloc(), ReadingSender(kv), rows, True

    def finished(self):
        return self.finished_reason is not None

    @property
    def slots(self):
        """What the stand-in's ``release_kv_cache`` frees: the request's row up to ``kv_committed_len``, given
        back once (SGLang frees a request's ``req_to_token`` row at its first release; a second finds nothing).
        Nothing when ``tree_keeps``: SGLang's stock radix cache inserts the request's pages in its tree."""
        held, self._held = self._held and not self.tree_keeps, False
        row = self._rows.req_to_token.t[self.req_pool_idx, : self.kv_committed_len].to(torch.int64)
        return row if held else row[:0]


class _Grammar:
    """A grammar that rejects the sampled token: SGLang releases the request's KV at once."""

    def accept_token(self, token):
        raise ValueError(f"token {token} is not in the grammar")


class _Batch:
    def __init__(self, reqs):
        self.reqs = reqs


class _Result:
    def __init__(self, n):
        self.next_token_ids = [7] * n


class TreeCache:
    def __init__(self, allocator):
        self.token_to_kv_pool_allocator = allocator


class Scheduler(SchedulerDisaggregationPrefillMixin):
    """The prefill scheduler's state the mixin reads; computes KV chunk by chunk (token i holds value + i)."""

    def __init__(self, sends_wrapper=None, engine=None):
        """``engine``: a :class:`prefix_driver.Engine` whose pool, rows and prefix cache the scheduler uses."""
        if engine is None:
            self.kv = MHAPool(SIZE, PAGE, layers=2)
            self.token_to_kv_pool_allocator = PagedTokenToKVPoolAllocator(
                SIZE, PAGE, torch.float32, "cpu", self.kv, False,
                kvshield_settings={"level": "ZERO", "strict": True, "advertisedContextTokens": SIZE})
            self.req_to_token_pool, self.tree_cache = ReqToTokenPool(), TreeCache(self.token_to_kv_pool_allocator)
        else:
            self.kv, self.token_to_kv_pool_allocator = engine.kv, engine.alloc
            self.req_to_token_pool, self.tree_cache = engine.rows, engine.cache
        if sends_wrapper is not None:
            self.token_to_kv_pool_allocator.kvshield_prefill_sends = sends_wrapper(
                disagg_prefill.PrefillSends(self.token_to_kv_pool_allocator), self)
        self.disagg_prefill_inflight_queue, self.req_to_metadata_buffer_idx_allocator = [], MetadataIdx()
        self.disagg_metadata_buffers = MetadataBuffers(4, 4, torch.float32)
        self.chunked_req, self.streamed = None, []

    @property
    def alloc(self):
        return self.token_to_kv_pool_allocator

    def stream_output(self, reqs, return_logprob, *args):
        self.streamed.extend(reqs)

    def request(self, rid, n, tenant="t1"):
        return Req(rid, n, tenant, self.req_to_token_pool, self.kv)

    def compute(self, req, upto, value):
        """The forward of ``req``'s tokens ``[len(fill_ids), upto)``: pages allocated for the request
        (its plan row names it), KV written, the row filled."""
        start = len(req.fill_ids)
        self.alloc.set_plan([(req.rid, req.kvshield_tenant, start, upto)])
        slots = self.alloc.alloc(-(-(upto - start) // PAGE) * PAGE)[: upto - start]
        self.alloc.clear_plan()
        for b in self.kv.buffers():
            b[slots] = (value + torch.arange(start, upto, dtype=torch.float32))[:, None, None]
        self.req_to_token_pool.req_to_token.t[req.req_pool_idx, start:upto] = slots.to(torch.int32)
        req.fill_ids, req.kv_committed_len = req.origin_input_ids[:upto], upto

    def prefill(self, req, value, grammar=None):
        """Chunked prefill of ``req``: each non-last chunk is sent by ``process_prefill_chunk``, the last by
        ``process_batch_result_disagg_prefill`` (which puts it in the inflight queue)."""
        n = len(req.origin_input_ids)
        req.grammar = grammar
        for upto in range(CHUNK, n, CHUNK):
            self.compute(req, upto, value)
            self.chunked_req = req
            self.process_prefill_chunk()
        self.chunked_req = None
        self.compute(req, n, value)
        self.process_batch_result_disagg_prefill(_Batch([req]), _Result(1))

    def expected(self, req, value):
        n = len(req.origin_input_ids)
        return (value + torch.arange(n, dtype=torch.float32))[None, :, None, None].expand(4, n, 1, 4)

    def pages_of(self, req):
        return set(req.disagg_kv_sender.pages)

    def bootstrap(self, req):
        """What the hooked ``PrefillBootstrapQueue`` does before any chunk: the sender armed to publish
        coverage (:func:`transport.arm_sender`), then SGLang's ``init`` with the metadata row. Returns the rows."""
        rows = types.SimpleNamespace(kvshield_coverage=torch.zeros((4, transport.ROW_WORDS), dtype=torch.int64))
        assert transport.arm_sender(req.disagg_kv_sender, req, rows, PAGE, SIZE)
        req.disagg_kv_sender.init(-(-len(req.origin_input_ids) // PAGE), req.metadata_buffer_index)
        return rows.kvshield_coverage

    def share_prefix(self, req, holder, tokens):
        """A stock radix-cache hit: ``req``'s row starts with ``holder``'s first ``tokens`` slots."""
        rows = self.req_to_token_pool.req_to_token.t
        rows[req.req_pool_idx, :tokens] = rows[holder.req_pool_idx, :tokens]
        req.fill_ids, req.kv_committed_len = req.origin_input_ids[:tokens], tokens

    def row_slots(self, req, start, end):
        return self.req_to_token_pool.req_to_token.t[req.req_pool_idx, start:end].to(torch.int64)

    def step(self):
        self.alloc.end_step()

    def check_no_host_sync(self, sent_chunks):
        """kvshield read no index tensor on the host; SGLang's own ``.cpu()`` ran once per chunk sent."""
        assert self.alloc.host_syncs() == 0, f"the allocator synced {self.alloc.host_syncs()} times"
        reads = self.req_to_token_pool.req_to_token.host_reads
        assert reads == sent_chunks, f"the request's row was read on the host {reads} times for {sent_chunks} chunks"


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


class ClaimsFromTheRow(_Wrapper):
    """Planted bug: the chunk's pages are taken from the request's device row (a host read per chunk)."""

    def claim(self, rid, page_indices):
        send = self.real.sends[rid]
        self.scheduler.req_to_token_pool.req_to_token[send.req.req_pool_idx, :send.chunk_end].cpu()
        return self.real.claim(rid, page_indices)


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


# ---------------------------------------------------------------- scenarios

def aborted_mid_transfer(twin=None):
    """A is aborted (its grammar rejects the token) right after its last chunk went to the transport:
    SGLang releases its KV at once, B allocates everything free, and the transport, still reading,
    reads A's bytes until it concludes; then A's pages are scrubbed and reused."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    a = s.request("a", 12)
    s.prefill(a, 100.0, grammar=_Grammar())
    assert isinstance(a.finished_reason, FINISH_ABORT) and s.disagg_prefill_inflight_queue == [a]
    s.step()
    b = s.request("b", s.alloc.available_size(), tenant="t2")  # everything the pool can hand out now
    s.compute(b, len(b.origin_input_ids), 500.0)
    s.process_disagg_prefill_inflight_queue()  # the transport still transfers: A stays
    s.step()
    seen = a.disagg_kv_sender.read(12)
    assert torch.equal(seen, s.expected(a, 100.0)), f"the transfer of aborted A read other bytes: {seen[0, :, 0, 0].tolist()}"
    a_pages = s.pages_of(a)
    b_pages = {int(p) // PAGE for p in s.req_to_token_pool.req_to_token.t[b.req_pool_idx, :len(b.fill_ids)].tolist()}
    assert not a_pages & b_pages, f"B got A's claimed pages {sorted(a_pages & b_pages)}"
    a.disagg_kv_sender.state = KVPoll.Failed  # the transport drained
    s.process_disagg_prefill_inflight_queue()
    s.step()
    assert not _sends(s).has_send(a.rid) and _sends(s).active() == 0
    assert torch.count_nonzero(a.disagg_kv_sender.read(12)) == 0, "A's pages were not scrubbed once the transfer concluded"
    c = s.request("c", s.alloc.available_size(), tenant="t3")
    s.compute(c, len(c.origin_input_ids), 900.0)
    c_pages = {int(p) // PAGE for p in s.req_to_token_pool.req_to_token.t[c.req_pool_idx, :len(c.fill_ids)].tolist()}
    assert a_pages <= c_pages, f"A's pages {sorted(a_pages)} did not return to circulation: C got {sorted(c_pages)}"
    s.check_no_host_sync(2)


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
    assert s.req_to_metadata_buffer_idx_allocator.freed == [0] and a.metadata_buffer_index == -1
    b = s.request("b", s.alloc.available_size(), tenant="t2")
    s.compute(b, len(b.origin_input_ids), 500.0)
    assert torch.equal(a.disagg_kv_sender.read(10), s.expected(a, 100.0)), "the overdue transfer read other bytes"
    a.disagg_kv_sender.state = KVPoll.Success  # late: the transport drained after all
    s.process_disagg_prefill_inflight_queue()
    disagg_prefill.sweep(s, sends)
    s.step()
    assert sends.active() == 0 and s.alloc.available_size() == held, (sends.active(), s.alloc.available_size(), held)
    s.check_no_host_sync(2)


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
    s.process_prefill_chunk()
    assert _sends(s).claimed_pages(a.rid) == 2 and _sends(s).sent_tokens(a.rid) == CHUNK
    s.chunked_req = None
    s.compute(a, n, 100.0)
    s.process_batch_result_disagg_prefill(_Batch([a]), _Result(1))
    assert _sends(s).claimed_pages(a.rid) == 5 and _sends(s).sent_tokens(a.rid) == n
    assert torch.equal(a.disagg_kv_sender.read(n), s.expected(a, 100.0))
    a.disagg_kv_sender.state = KVPoll.Success
    done = s.process_disagg_prefill_inflight_queue()
    s.step()
    assert done == [a] and isinstance(a.finished_reason, FINISH_LENGTH)
    assert s.alloc.available_size() == full, f"a completed transfer's pages were not freed: {s.alloc.available_size()} of {full}"
    assert torch.count_nonzero(a.disagg_kv_sender.read(n)) == 0, "freed pages were not scrubbed"
    s.check_no_host_sync(2)


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
    s.check_no_host_sync(2)


def refused_claim(twin=None):
    """Chunks kvshield cannot claim never reach the transport and the client sees the error: A carries no
    tenant (refused at its first chunk); B's last page left it before its last chunk (SGLang freed it),
    so that chunk is refused while the one already handed over stays claimed until the sender concludes."""
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = Scheduler(twin)
    full = s.alloc.available_size()
    a = s.request("a", 6)
    s.compute(a, 6, 1.0)
    a.kvshield_tenant = None
    s.process_batch_result_disagg_prefill(_Batch([a]), _Result(1))
    assert a.disagg_kv_sender.pages == [] and a.finished_reason.status_code == 500, a.finished_reason.to_json()
    assert "no kvshield tenant" in a.finished_reason.message
    b = s.request("b", 12)
    s.compute(b, CHUNK, 2.0)
    s.chunked_req = b
    s.process_prefill_chunk()
    s.chunked_req = None
    s.compute(b, 12, 2.0)
    s.alloc.free(s.req_to_token_pool.req_to_token.t[b.req_pool_idx, CHUNK:12].to(torch.int64))
    b.kv_committed_len = CHUNK
    s.process_batch_result_disagg_prefill(_Batch([b]), _Result(1))
    assert len(b.disagg_kv_sender.pages) == 2, f"a refused chunk reached the transport: pages {b.disagg_kv_sender.pages}"
    assert b.finished_reason.status_code == 500 and "not allocated now" in b.finished_reason.message, b.finished_reason.to_json()
    s.process_disagg_prefill_inflight_queue()
    s.step()
    assert a in s.streamed and b in s.streamed and not s.disagg_prefill_inflight_queue and _sends(s).active() == 0
    assert s.alloc.available_size() == full, (s.alloc.available_size(), full)


class CachedReq(prefix_driver.Req):
    """A prefill request over the kvshield prefix cache: the fields of SGLang's Req the prefill mixin reads,
    on top of what :mod:`prefix_driver` drives the cache with."""

    def __init__(self, engine, rid, tenant, tokens):
        super().__init__(rid, tenant, tokens)
        self._engine, self._held = engine, True
        self.start_send_idx, self.is_chunked, self.grammar, self.return_logprob = 0, 0, None, False
        self.bootstrap_host, self.bootstrap_port, self.bootstrap_room = "10.0.0.2", 8998, zlib.crc32(rid.encode()) & 0xFFFF
        self.finished_reason, self.metadata_buffer_index, self.disagg_kv_sender = None, 0, ReadingSender(engine.kv)

    def finished(self):
        return self.finished_reason is not None

    def pop_committed_kv_cache(self):
        return len(self.origin_input_ids)

    @property
    def slots(self):
        """SGLang's ``release_kv_cache`` over a tree cache: ``cache_finished_req`` settles the request's pages
        (the cache takes them, its lock goes), the row goes back; at the first release only. Nothing is freed directly."""
        if self._held:
            self._held = False
            self._engine.finish(self)
        return torch.empty((0,), dtype=torch.int64)


def _cache_engine():
    return prefix_driver.Engine(lambda params, shared: prefix_cache.KvShieldPrefixCache(params, shared), size=SIZE, page=PAGE)


def _hit_the_cached_prefix(engine, s):
    """W's 8-token prompt is computed and cached (2 pages, the cache namespace's); A (12 tokens, same tenant)
    hits it and computes its last page; its sender is armed. Returns A and its coverage rows."""
    prompt = list(range(1, 9))
    assert engine.run(prefix_driver.Req("w", "t1", prompt)) is not None
    a = CachedReq(engine, "a", "t1", prompt + [9, 10, 11, 12])
    engine.admit(a)
    assert a.matched_tokens == 8, a.matched_tokens
    cached = [int(p) for p in engine.rows.req_to_token[a.req_pool_idx, 0:8:PAGE].as_subclass(torch.Tensor) // PAGE]
    assert all(s.alloc._j.requestOf(p) < 0 and s.alloc._j.isOwned(p) for p in cached), "the prefix is not the cache's"
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
    s.process_batch_result_disagg_prefill(_Batch([a]), _Result(1))
    assert set(cached) <= s.pages_of(a) and len(s.pages_of(a)) == 3, (cached, a.disagg_kv_sender.pages)
    assert _sends(s).claimed_pages(a.rid) == 3 and _sends(s).sent_tokens(a.rid) == 12
    assert coverage[0, :3].tolist() == [transport.ROW_MAGIC, a.bootstrap_room, 12], coverage[0]
    assert torch.equal(a.disagg_kv_sender.read(12), engine.expected("t1", a.origin_input_ids)), "the transfer read other bytes"
    a.disagg_kv_sender.state = KVPoll.Success
    assert s.process_disagg_prefill_inflight_queue() == [a]
    s.step()
    assert engine.cache.evictable_size() == 3 * PAGE, f"the path is not evictable: {engine.cache.evictable_size()} tokens"
    engine.cache.evict(prefix_cache.EvictParams(num_tokens=3 * PAGE))
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
    a.grammar = _Grammar()
    s.process_batch_result_disagg_prefill(_Batch([a]), _Result(1))
    assert isinstance(a.finished_reason, FINISH_ABORT) and engine.cache.evictable_size() == 3 * PAGE
    engine.cache.evict(prefix_cache.EvictParams(num_tokens=3 * PAGE))
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
    a = s.request("a", 12)
    s.share_prefix(a, e, 8)
    s.compute(a, 12, 100.0)
    a.tree_keeps, a.grammar = True, _Grammar()
    s.process_batch_result_disagg_prefill(_Batch([a]), _Result(1))
    assert len(s.pages_of(a)) == 3, a.disagg_kv_sender.pages
    s.alloc.free(s.row_slots(e, 0, 8))  # the tree evicts the prefix (E's) and A's page
    s.alloc.free(s.row_slots(a, 8, 12))
    s.step()
    b = s.request("b", s.alloc.available_size(), tenant="t2")
    s.compute(b, len(b.origin_input_ids), 500.0)
    assert torch.equal(a.disagg_kv_sender.read(12), s.expected(a, 100.0)), "the transfer read other bytes"
    assert _sends(s).claimed_pages(a.rid) == 3
    a.disagg_kv_sender.state = KVPoll.Success
    s.process_disagg_prefill_inflight_queue()
    s.step()
    assert _sends(s).active() == 0 and s.alloc.available_size() == 3 * PAGE, s.alloc.available_size()
    assert torch.count_nonzero(a.disagg_kv_sender.read(12)) == 0, "freed pages were not scrubbed"
    s.check_no_host_sync(1)


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
    s.process_batch_result_disagg_prefill(_Batch([a]), _Result(1))
    assert a.disagg_kv_sender.pages == [], f"a page of another tenant reached the transport: {a.disagg_kv_sender.pages}"
    page = int(s.row_slots(o, 0, 1)) // PAGE
    message = a.finished_reason.message
    assert a.finished_reason.status_code == 500 and f"page {page} of tenant {s.alloc.tenant_id('t2')}" in message \
        and f"request {s.alloc.request_id('a')}" in message, message
    assert torch.count_nonzero(coverage) == 0, "a refused chunk wrote the coverage row"
    a.disagg_kv_sender.send([page])  # a later send on a refused request's sender is dropped too
    assert a.disagg_kv_sender.pages == [], f"a send after the refusal reached the transport: {a.disagg_kv_sender.pages}"
    s.process_disagg_prefill_inflight_queue()  # A's release gives back its whole row, O's page with it
    s.step()
    assert a in s.streamed and _sends(s).active() == 0 and s.alloc.available_size() == full, s.alloc.available_size()


SCENARIOS = {
    "aborted": (aborted_mid_transfer, {}),
    "aborted/releases_without_claims": (aborted_mid_transfer, {"twin": ReleasesWithoutClaims}),
    "never_concludes": (never_concludes, {}),
    "never_concludes/frees_on_timeout": (never_concludes, {"twin": FreesOnTimeout}),
    "completes": (completes, {}),
    "completes/keeps_claims": (completes, {"twin": KeepsClaims}),
    "completes/claims_from_the_row": (completes, {"twin": ClaimsFromTheRow}),
    "completes_before_release": (completes_before_release, {}),
    "completes_before_release/keeps_claims": (completes_before_release, {"twin": KeepsClaims}),
    "refused_claim": (refused_claim, {}),
    "refused_claim/sends_unclaimed": (refused_claim, {"twin": SendsUnclaimed}),
    "prefix_cache_hit_completes": (prefix_cache_hit_completes, {}),
    "prefix_cache_hit_completes/keeps_claims": (prefix_cache_hit_completes, {"twin": KeepsClaims}),
    "prefix_cache_evicted_mid_transfer": (prefix_cache_evicted_mid_transfer, {}),
    "prefix_cache_evicted_mid_transfer/claims_own_pages_only": (prefix_cache_evicted_mid_transfer, {"twin": ClaimsOwnPagesOnly}),
    "stock_prefix_hit": (stock_prefix_hit, {}),
    "stock_prefix_hit/claims_own_pages_only": (stock_prefix_hit, {"twin": ClaimsOwnPagesOnly}),
    "foreign_page": (foreign_page, {}),
    "foreign_page/skips_tenant_check": (foreign_page, {"twin": SkipsTenantCheck}),
}


def main():
    features = disagg_prefill.install_in_sglang()
    assert features == {"prefill_sends": True}, features
    scenarios.report(SCENARIOS)
