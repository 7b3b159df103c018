"""Streaming-session scenarios on the real SGLang, on CPU, with no model forward (kvshield's plug-in loaded).

A :class:`World` is one scheduler's memory on SGLang's own classes: a small ``MHATokenToKVPool`` (pages are
reused every few steps), kvshield's KV allocator, and a tree cache with SGLang's ``StreamingSession``
(``UnifiedRadixCache``'s embedded one, or SGLang's wrapper around ``ChunkCache`` as ``registry`` builds it
with ``--enable-streaming-session``). Two tenants each run a streaming ``Session`` (SGLang's own class);
their turns interleave with plain requests of the other tenant that take whatever the pool hands out.

Each turn is one request as SGLang's scheduler runs it: matched (``StreamingSession.try_match_prefix``
restores the session's slot), admitted by ``PrefillAdder``, ``prepare_for_extend`` (``alloc_for_extend``),
the driver's forward writing the KV, then ``release_kv_cache`` (``try_cache_finished_req`` keeps it in the
slot). The turns include one with no new input (``_free_tail`` frees the orphaned tail at the match), a
mid-turn abort (``release_session`` inside the release), a turn detached after its match (prefilled and
released as a plain request: the session's row stays the slot's), a running turn beside which a pre-aborted
request, a second request and the session's close arrive (refused, refused, deferred to the turn's end) and,
at the end, each session's close (``release_session`` outside any request).

The content oracle: the driver writes, at every slot a turn gets, a value naming the tenant, the session
and the token position (:func:`value`); after every step (a step boundary scrubs released pages, and the
next allocation hands them on), each session's kept KV (its slot's ``req_to_token`` row up to its committed
length) and each turn's prefix (what the turn reads as its history) must read back exactly the session's
own values ("isolation" otherwise). A request of the other tenant naming a session must be refused before
it reads anything: no prefix (though its tokens are the session's history) and a one-token input. After the
sessions close, every page is back (available or evictable) with no free refused ("leak" otherwise). The
planted-bug twins turn the fix off (the session no longer keeps its turn's pages: the release hands them
back; a turn SGLang detached from the session still frees as the session, or keeps the session's row; a
second turn is let in beside a running one and the close does not wait; a refused turn is matched on its
key) and must fail the content oracle. ``main`` prints ``RESULTS <json>``.
"""

import contextlib

import torch

import servers
from fakes import MHAPool
from scenarios import report

TENANTS = ("acme", "globex")
SIZE = 48  # tokens: two sessions' histories and one plain request fill it


def value(tenant_code, session_code, positions):
    """The KV the driver writes at a token (exact in float32): tenant, session (9: a plain request), position."""
    return (tenant_code * 10000 + session_code * 1000 + positions).to(torch.float32)


class Session:
    """What the driver knows of one streaming session: its tenant (the workload's truth), code and history."""

    def __init__(self, world, name, tenant, code):
        from sglang.srt.session.session_controller import Session as SGLangSession

        self.name, self.tenant, self.code = name, tenant, code
        self.tenant_code = TENANTS.index(tenant) + 1
        self.session = SGLangSession(1 << 20, session_id=name, streaming=True)
        self.tokens = []  # the history the session's slot keeps (its last finished turn's tokens)
        self.turns = 0


class World:
    def __init__(self, cache, page_size):
        import sglang.srt.mem_cache.allocator.paged as paged
        import sglang.srt.mem_cache.allocator.token as token

        servers.publish_server_args(attention_backend="torch_native")
        self.page_size = page_size
        self.kv = MHAPool(SIZE, page_size)
        if page_size == 1:
            self.alloc = token.TokenToKVPoolAllocator(SIZE, torch.float32, "cpu", self.kv, False)
        else:
            self.alloc = paged.PagedTokenToKVPoolAllocator(SIZE, page_size, torch.float32, "cpu", self.kv, False)
        self.cache = servers.radix_cache(self.alloc) if cache == "unified" else self._wrapped(cache)
        self.sessions = {}
        self.serial = 0
        self.refused = 0  # frees the scenario expects the pool to refuse (a detached turn's)
        # slots SGLang frees per phase of the run (the paths the scenario must take: see sessions())
        self.phase, self.freed = None, {}
        free = self.alloc.free

        def counted(free_index):
            self.freed[self.phase] = self.freed.get(self.phase, 0) + free_index.numel()
            return free(free_index)

        self.alloc.free = counted
        self.noise_tokens = 1000  # plain requests' tokens never repeat (no prefix hits on them)

    def _wrapped(self, cache):
        """SGLang's ``StreamingSession`` around a cache without streaming support (``ChunkCache``, kvshield's
        backend), as ``registry`` builds it with ``--enable-streaming-session``."""
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.chunk_cache import ChunkCache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.session.streaming_session import StreamingSession

        from kvshield_sglang.prefix_cache import KvShieldPrefixCache

        rows = ReqToTokenPool(size=16, max_context_len=128, device="cpu", enable_memory_saver=False)
        params = CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=self.alloc,
                                 page_size=self.page_size, eviction_policy="lru")
        return StreamingSession(ChunkCache(params) if cache == "chunk" else KvShieldPrefixCache(params))

    def _slots(self):
        return self.cache.session.slots if hasattr(self.cache, "tree_core") else self.cache.slots

    # ------------------------------------------------------------ the driver

    def open(self, name, tenant):
        s = self.sessions[name] = Session(self, name, tenant, len(self.sessions) + 1)
        return s

    def _prefill(self, req):
        batch = servers.prefill(self.cache, [req])
        assert batch is not None, f"stall: {req.rid} was not admitted ({self.alloc.available_size()} tokens available)"
        return batch

    def _write(self, batch, req, tenant_code, session_code):
        """The forward: the batch's one request writes its new positions' values at the slots it was given."""
        slots = batch.out_cache_loc.to(torch.int64)
        positions = torch.arange(len(req.prefix_indices), len(req.prefix_indices) + len(slots))
        vals = value(tenant_code, session_code, positions)
        for b in self.kv.buffers():
            b[slots] = vals.view(-1, 1, 1)

    def _read(self, slots, tenant_code, session_code, what):
        slots = slots.to(torch.int64)
        got = self.kv.read(slots)  # (buffers, n, heads, dim)
        want = value(tenant_code, session_code, torch.arange(len(slots))).view(1, -1, 1, 1).expand_as(got)
        bad = (got != want).any(dim=3).any(dim=2).any(dim=0).nonzero().flatten().tolist()
        assert not bad, (f"isolation: {what}: position {bad[0]} (slot {int(slots[bad[0]])}) holds "
                         f"{got[0, bad[0], 0, 0].item()}, its own KV is {want[0, bad[0], 0, 0].item()} "
                         f"({len(bad)} of {len(slots)} positions wrong)")

    def turn(self, name, new_tokens, abort=False):
        """One turn of session ``name``: its history plus ``new_tokens``, prefilled, written and released (as a
        mid-turn abort with ``abort``)."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
        from sglang.srt.mem_cache import common

        s = self.sessions[name]
        tokens = s.tokens + list(new_tokens)
        s.turns += 1
        req = servers.request(f"{name}-turn{s.turns}", tokens, s.tenant, session=s.session)
        s.session._inflight = True  # Session.create_req sets it for a streaming turn
        self.phase = "match" if not new_tokens else None
        batch = self._prefill(req)
        self._read(req.prefix_indices, s.tenant_code, s.code, f"turn {req.rid} reads its history")
        self._write(batch, req, s.tenant_code, s.code)
        req.kv_committed_len = len(tokens)
        common.maybe_cache_unfinished_req(req, self.cache)  # the turn decodes on (a first turn: the tree takes it)
        if abort:
            req.finished_reason = FINISH_ABORT()
        else:
            req.finished_reason, req.finished_len = FINISH_LENGTH(length=0), 0
        self.phase = "abort" if abort else None
        common.release_kv_cache(req, self.cache)
        self.phase = None
        if not abort:
            s.tokens = tokens
        self.step()

    def plain(self, tenant):
        """A plain request of ``tenant`` taking most of what the pool has, written and released (what the
        cache keeps of it is evicted when a later allocation needs the room)."""
        n = self.alloc.available_size() + self.cache.evictable_size() - 8
        n -= n % self.page_size
        tokens = list(range(self.noise_tokens, self.noise_tokens + n))
        self.noise_tokens += n
        self.finish(self.start(tenant, tokens))
        return n

    def start(self, tenant, tokens):
        """A plain request of ``tenant``, prefilled and written; live until :meth:`finish`."""
        self.serial += 1
        req = servers.request(f"plain{self.serial}", tokens, tenant, max_new_tokens=1)
        batch = self._prefill(req)
        self._write(batch, req, TENANTS.index(tenant) + 1, 9)
        req.kv_committed_len = len(tokens)
        return req

    def finish(self, req):
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache import common

        req.finished_reason, req.finished_len = FINISH_LENGTH(length=0), 0
        common.release_kv_cache(req, self.cache)
        self.step()

    def foreign_turn(self, name, tenant):
        """A request of ``tenant`` naming session ``name`` (another tenant's): it must be refused at its match."""
        s = self.sessions[name]
        # NOTE: Session.create_req builds it on the session's history (the first turn's prefix is in the tree)
        req = servers.request(f"{name}-foreign", s.tokens + [9000, 9001], tenant, session=s.session)
        s.session._inflight = True  # Session.create_req made it the session's turn
        req.init_next_round_input(self.cache)
        assert req.session is None and req.to_finish is not None, \
            f"isolation: a request of {tenant} was let into {s.tenant}'s streaming session {name}"
        got = self.kv.read(req.prefix_indices.to(torch.int64))[0, :, 0, 0]
        assert req.req_pool_idx is None and not len(got), \
            (f"isolation: a request of {tenant} refused from {s.tenant}'s session {name} matched {len(got)} tokens, "
             f"{int((got // 10000 == s.tenant_code).sum())} of them holding {s.tenant}'s KV")
        assert len(req.full_untruncated_fill_ids) == 1, \
            f"isolation: a request of {tenant} refused from session {name} would prefill its history"
        assert not s.session._inflight, f"session {name} stays blocked by the refused request"

    def detached_turn(self, name):
        """A turn restored onto the session's slot at its match, then aborted before its prefill: SGLang detaches
        it from the session at its next match. A free of the slot's KV through it afterwards (what a release of
        the detached request would free) must be refused: it no longer serves as the session."""
        s = self.sessions[name]
        req = servers.request(f"{name}-detached", s.tokens + [3], s.tenant, session=s.session)
        s.session._inflight = True
        req.init_next_round_input(self.cache)
        assert len(req.prefix_indices) == len(s.tokens), "the turn was not restored onto the session's slot"
        req.set_finish_with_abort("aborted before its prefill")
        req.init_next_round_input(self.cache)
        assert req.session is None, "SGLang did not detach the aborted turn"
        before, kept = self.alloc.rejected_frees(), self._kept_slots(s)
        with self.alloc.releasing(s.tenant, req):
            self.alloc.free(kept)
        refused, pages = self.alloc.rejected_frees() - before, len(set((kept // self.page_size).tolist()))
        self.refused += refused
        self.step()  # the oracle re-reads the session's KV: a page that free released is scrubbed by now
        assert refused == pages, \
            f"isolation: a request detached from session {name} freed {pages - refused} of the session's pages"
        self.finish(self.run_aborted(req, s.tenant))  # SGLang prefills and releases it as a plain request
        row = self._slots()[name].req_pool_idx
        assert row not in self.cache.req_to_token_pool.free_slots, \
            f"isolation: the request detached from session {name} gave the session's row {row} back"
        self.plain("globex" if s.tenant == "acme" else "acme")  # the other tenant takes what is free, rows too

    def run_aborted(self, req, tenant):
        """SGLang's next pass over an aborted request: admitted, prefilled (its one-token stub), written."""
        batch = self._prefill(req)
        self._write(batch, req, TENANTS.index(tenant) + 1, 9)
        req.kv_committed_len = int(batch.seq_lens_cpu[0])
        return req

    def live_turn_refuses_others(self, name):
        """A turn of session ``name`` runs (prefilled, written, not finished) while the same client's next requests
        arrive: one refused at creation (``create_req``: already an active request; SGLang's ``find_active_slot``
        would clear the in-flight flag), one let in as if accepted, and the session's close. None may touch the
        running turn's KV: both requests are refused at their match (prefilled as plain one-token requests,
        released), the close waits for the turn, the other tenant takes every free page, and the running turn's
        row (history and its own pages) reads back the session's values. The turn then finishes: the deferred
        close releases the session."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache import common

        s = self.sessions[name]
        tokens = s.tokens + [71, 72, 73]
        live = servers.request(f"{name}-live", tokens, s.tenant, session=s.session)
        s.session._inflight = True
        batch = self._prefill(live)
        self._read(live.prefix_indices, s.tenant_code, s.code, f"turn {live.rid} reads its history")
        self._write(batch, live, s.tenant_code, s.code)
        live.kv_committed_len = len(tokens)
        row = live.req_pool_idx
        refused = servers.request(f"{name}-refused", s.tokens + [80], s.tenant, session=s.session)
        refused.set_finish_with_abort("Streaming session already has an active request.")
        second = servers.request(f"{name}-second", s.tokens + [81], s.tenant, session=s.session)
        for req in (refused, second):
            req.init_next_round_input(self.cache)
            self.run_aborted(req, s.tenant).finished_reason, req.finished_len = FINISH_LENGTH(length=0), 0
            common.release_kv_cache(req, self.cache)
            self.alloc.end_step()  # NOTE: no re-read here: the content read below names what went wrong
        self.close(name)
        self.plain("globex" if s.tenant == "acme" else "acme")
        self._read(self.cache.req_to_token_pool.req_to_token[row, :len(tokens)], s.tenant_code, s.code,
                   f"running turn {live.rid}'s KV after the session's close and other requests' releases")
        assert refused.session is None and second.session is None and s.session._inflight, \
            f"session {name}: a request was let in beside its running turn, or it is no longer in flight"
        live.finished_reason, live.finished_len = FINISH_LENGTH(length=0), 0
        common.release_kv_cache(live, self.cache)
        assert name not in self._slots(), f"session {name}'s deferred close did not release it"
        del self.sessions[name]
        self.step()

    def close(self, name):
        self.phase = "close"
        self.cache.release_session(name)  # what SessionController._close calls
        self.phase = None
        self.step()

    def _kept_slots(self, s):
        slot = self._slots().get(s.name)
        if slot is None or slot.kv is None:
            return torch.empty((0,), dtype=torch.int64)
        return self.cache.req_to_token_pool.req_to_token[slot.req_pool_idx, :slot.kv_committed_len].to(torch.int64)

    # ------------------------------------------------------------ the oracle

    def step(self):
        """A step boundary (released pages are scrubbed and handed on from here), then every session's kept KV
        re-read."""
        self.alloc.end_step()
        for s in self.sessions.values():
            slot = self._slots().get(s.name)
            if slot is not None and slot.kv is not None:
                assert slot.kv_committed_len == len(s.tokens), (s.name, slot.kv_committed_len, len(s.tokens))
                self._read(self._kept_slots(s), s.tenant_code, s.code, f"session {s.name}'s kept KV")

    def no_leak(self):
        assert not self._slots(), f"slots left: {sorted(self._slots())}"
        back = self.alloc.available_size() + self.cache.evictable_size()
        assert back == SIZE and self.alloc.rejected_frees() == self.refused, \
            (f"leak: {back} of {SIZE} tokens back after every session closed, {self.alloc.rejected_frees()} free(s)"
             f" refused ({self.refused} expected): {self.alloc._j.lastRejection()}")


def tokenized(rid, ids, prev=None):
    """What SGLang's tokenizer sends the scheduler for request ``rid`` of ``ids`` naming streaming session "sa" (after
    turn ``prev``, when given): four new tokens at most."""
    from array import array

    from sglang.srt.managers.io_struct import SessionParams, TokenizedGenerateReqInput
    from sglang.srt.sampling.sampling_params import SamplingParams

    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=array("q", ids), input_embeds=None, mm_inputs=None, token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=4), return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=False, session_params=SessionParams(id="sa", rid=prev))


def session_control(world):
    """SGLang's session open/close path over ``world``'s cache: its ``SessionController``, a scheduler holding it
    (one rank) and a ``TokenizerManager`` (streaming sessions on) whose ``open_session``/``close_session`` calls
    reach the scheduler's handlers. Returns ``(controller, tokenizer manager, control)``: ``control(coro)`` runs one tokenizer call
    (with the FastAPI request it was given) and hands what it sent to the scheduler; it returns ``(sent object,
    the scheduler's answer)`` per object sent."""
    import asyncio
    import types

    from sglang.srt.managers.io_struct import OpenSessionReqInput
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.session.session_controller import SessionController

    controller = SessionController(world.cache)
    sched = types.SimpleNamespace(enable_session_radix_cache=False, tree_cache=world.cache,
                                  session_controller=controller,
                                  ps=types.SimpleNamespace(pp_rank=0, tp_rank=0, attn_cp_rank=0))
    tm = servers.tokenizer_manager()
    tm.server_args.enable_streaming_session, tm.session_futures, sent = True, {}, []

    def dispatch(obj):  # what crosses to the scheduler; the scheduler's answer
        sent.append(obj)
        tm.session_futures[obj.session_id].set_result(obj.session_id)

    async def dispatch_async(obj):
        sent.append(obj)

    tm._dispatch_to_scheduler, tm._async_dispatch_to_scheduler = dispatch, dispatch_async

    def control(coro):
        sent.clear()
        asyncio.run(coro)
        handler = {True: Scheduler.open_session, False: Scheduler.close_session}
        return [(obj, handler[isinstance(obj, OpenSessionReqInput)](sched, obj)) for obj in list(sent)]

    return controller, tm, control


def sessions(cache, page_size):
    """Two tenants' streaming sessions, turns interleaved with plain requests of the other tenant."""
    w = World(cache, page_size)
    w.open("sa", "acme")
    w.open("sg", "globex")
    reused = 0
    for t in range(3):
        w.turn("sa", range(1, 8) if t == 0 else [10 * t + 1, 10 * t + 2, 10 * t + 3])  # 13 tokens after 3 turns
        reused += w.plain("globex")
        w.turn("sg", range(500 + 10 * t, 500 + 10 * t + 3))
        reused += w.plain("acme")
    w.foreign_turn("sa", "globex")
    w.foreign_turn("sg", "acme")
    w.detached_turn("sa")
    w.turn("sa", [])  # no new input: the match frees the orphaned tail (_free_tail) and the turn rewrites it
    w.plain("globex")
    w.turn("sg", [590, 591], abort=True)  # mid-turn abort: release_session inside the release
    w.plain("acme")
    w.turn("sg", [592])  # re-prefilled from scratch
    w.turn("sa", [99])
    # a live request of the session's tenant sharing its first turn's first page (a prefix hit: both lock the
    # node) across the session's close, which must release the session's lock, not this request's
    live = w.start("acme", w.sessions["sa"].tokens[:4] + list(range(9500, 9504)))
    w.close("sa")
    w.finish(live)
    w.live_turn_refuses_others("sg")  # closes sg once its running turn ends
    w.plain("acme")
    w.no_leak()
    missed = [p for p in ("match", "abort", "close") if not w.freed.get(p)]
    assert not missed, f"the run never freed a session's KV at: {missed} (freed: {w.freed})"
    assert reused >= 4 * SIZE // 2, f"the plain requests took only {reused} tokens: the pool was never reused"


@contextlib.contextmanager
def _planted(module, name, bug):
    """``module.name`` is ``bug`` inside (the hooks look it up at each call), restored after."""
    fixed = getattr(module, name)
    setattr(module, name, bug)
    try:
        yield
    finally:
        setattr(module, name, fixed)


def twin_second_live_turn_let_in(cache, page_size):
    """Planted bug: a second turn is let onto a session whose turn runs, and its close does not wait for it."""
    from kvshield_sglang import plugin

    with _planted(plugin, "_live_turn", lambda session: None):
        sessions(cache, page_size)


def twin_refused_turn_matches_its_key(cache, page_size):
    """Planted bugs: a refused turn is matched on its key (the session's history), in a tree whose namespaces are
    the client's ``extra_key`` alone (else the tenant-scoped tree already misses another tenant's history)."""
    from kvshield_sglang import plugin
    from sglang.srt.managers.schedule_batch import Req

    plain = property(lambda req: req.__dict__.get("_kvshield_extra_key"),
                     lambda req, value: req.__dict__.__setitem__("_kvshield_extra_key", value))
    with _planted(plugin, "_no_match", lambda streaming, params: streaming.inner.match_prefix(params)), \
            _planted(Req, "extra_key", plain):
        sessions(cache, page_size)


def twin_detached_turn_keeps_the_row(cache, page_size):
    """Planted bug: a turn detached after its match keeps the session's row."""
    from kvshield_sglang import plugin

    with _planted(plugin, "_drop_slot_state", lambda req, slot: None):
        sessions(cache, page_size)


def twin_session_kv_released(cache, page_size):
    """Planted bug: the fix off (a turn's release no longer leaves the session's kept KV the session's)."""
    from kvshield_sglang.allocator import _KvShieldMixin

    _KvShieldMixin.session_kept = lambda self, req, holder: None
    sessions(cache, page_size)


def twin_detached_turn_still_serves(cache, page_size):
    """Planted bug: a turn SGLang detached from its session still serves as the session."""
    from kvshield_sglang.allocator import _KvShieldMixin

    _KvShieldMixin.leave_session = lambda self, req, holder: None
    sessions(cache, page_size)


def main():
    from kvshield_sglang import plugin

    plugin.load()
    with servers.single_rank():  # SGLang's parallel state of a one-rank server, for every scenario
        _report()


def _report():
    report({"sessions-unified-p1": (sessions, {"cache": "unified", "page_size": 1}),
            "sessions-unified-p4": (sessions, {"cache": "unified", "page_size": 4}),
            "sessions-chunk-p4": (sessions, {"cache": "chunk", "page_size": 4}),
            "sessions-kvshield-p4": (sessions, {"cache": "kvshield", "page_size": 4}),
            # these restore what they plant
            "twin-second-live-turn-let-in-unified-p1": (twin_second_live_turn_let_in,
                                                        {"cache": "unified", "page_size": 1}),
            "twin-refused-turn-matches-its-key-unified-p4": (twin_refused_turn_matches_its_key,
                                                             {"cache": "unified", "page_size": 4}),
            "twin-detached-turn-keeps-the-row-chunk-p4": (twin_detached_turn_keeps_the_row,
                                                          {"cache": "chunk", "page_size": 4}),
            # last: they patch the allocator class for the rest of the process
            "twin-detached-turn-still-serves-unified-p4": (twin_detached_turn_still_serves,
                                                           {"cache": "unified", "page_size": 4}),
            "twin-session-kv-released-unified-p4": (twin_session_kv_released, {"cache": "unified", "page_size": 4})})
