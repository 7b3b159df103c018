"""SGLang plug-in: ``load()`` is the ``sglang.srt.plugins`` entry point, run in every SGLang process.

In each process it exports a rank directory (``$KVSHIELD_RANK_DIR``) so scheduler processes spawned later
inherit it, then installs every hook (:data:`HOOKS`), each found by name and checked by signature first
(:mod:`kvshield_sglang.hooks`); a hook that cannot be installed is recorded, never skipped silently. The
allocator classes are swapped in last, so a process whose hooks failed early still reports them: the
allocator's rank report carries every hook's outcome, a rank with a failed hook reports itself not
protected and its scheduler stops, and the launching process's gate (``http_server._wait_and_warmup``)
refuses to serve unless every expected rank reported active.
"""

import dataclasses
import functools
import inspect
import logging
import sys

from . import engine_hooks, hooks, ranks
from .tenants import RecomputeChannel, TenantChannel, TenantResolver, request_pages, worst_case_pages

logger = logging.getLogger(__name__)
_installed = False


def load():
    """Entry point: idempotent; installs every hook, recording each outcome (never raises: SGLang would
    swallow it and serve half-installed)."""
    global _installed
    # NOTE: SGLang swallows what load() raises and would serve on its own allocators, with no hook and no gate: a
    # setting that fails is recorded as a failed hook instead (the rank refuses, naming it), and every hook still
    # goes in (tenant-blind without the tenant settings), so the allocator is kvshield's and reports it.
    hooks.attempt("rank-dir", ranks.ensure_dir)
    if _installed:
        return
    _installed = True
    resolver = hooks.attempt("tenant-settings", TenantResolver.from_env) or TenantResolver()
    for name, install in HOOKS:
        hooks.install(name, functools.partial(install, resolver))
    if hooks.failed():
        logger.error("kvshield: not every hook is installed in this process; its rank will refuse to serve: %s",
                     "; ".join(hooks.failed()))
    else:
        logger.info("kvshield: every hook installed in this process")


def replace_everywhere(replacements, modules=None):
    """Rebinds every module attribute that is one of ``replacements``' keys to its value; returns how many."""
    n = 0
    for mod in list((modules or sys.modules).values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for attr, value in list(d.items()):
            try:
                new = replacements.get(value)
            except TypeError:  # unhashable attribute values
                continue
            if new is not None:
                setattr(mod, attr, new)
                hooks.bound(mod, attr, new)
                n += 1
    return n


def plan_rows(reqs, prefix_lens, seq_lens, resolver):
    """(request, tenant, prefix_len, seq_len) per request (the ``Req`` object: its identity, never its
    client-chosen rid), the tenant from trusted server-side data only."""
    return [(r, resolver.resolve_request(r), int(p), int(s)) for r, p, s in zip(reqs, prefix_lens, seq_lens)]


def _kvshield(allocator):
    """``allocator`` when it is kvshield's (SGLang's own, or a test's stand-in, is left alone), else None."""
    from .allocator import _KvShieldMixin

    return allocator if isinstance(allocator, _KvShieldMixin) else None


def _planned(fn, rows_of, allocator_of):
    """``fn`` with each call's plan (``rows_of(*args, **kwargs)``) set on the kvshield allocator first and a
    step boundary on the step's first crossing; the plan is cleared afterwards whatever happens."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        alloc = _kvshield(allocator_of(*args, **kwargs))
        if alloc is None:
            return fn(*args, **kwargs)
        alloc.begin_step()
        alloc.set_plan(rows_of(*args, **kwargs))
        try:
            return fn(*args, **kwargs)
        finally:
            alloc.clear_plan()

    wrapper._kvshield = True
    return wrapper


def _install_planning(resolver):
    """``mem_cache.allocation``'s per-request planning: every allocation of a scheduler step is attributed
    to its requests and tenants (``[prefix, seq)`` per request)."""
    module = "sglang.srt.mem_cache.allocation"
    extend = hooks.expect(hooks.lookup(module, "alloc_for_extend"), f"{module}.alloc_for_extend", ("batch",))
    decode = hooks.expect(hooks.lookup(module, "alloc_for_decode"), f"{module}.alloc_for_decode",
                          ("batch", "token_per_req"))
    spec = hooks.expect(hooks.lookup(module, "alloc_for_spec_decode"), f"{module}.alloc_for_spec_decode",
                        ("tree_cache", "req_to_token_pool"),
                        ("reqs", "cur_kv_lens_cpu", "nxt_kv_lens_cpu"))

    def extend_rows(batch, *a, **k):
        return plan_rows(batch.reqs, batch.prefix_lens, batch.seq_lens_cpu.tolist(), resolver)

    def decode_rows(batch, token_per_req, *a, **k):
        seq = [int(s) for s in batch.seq_lens_cpu.tolist()]
        return plan_rows(batch.reqs, seq, [s + token_per_req for s in seq], resolver)

    def spec_rows(tree_cache, req_to_token_pool, *a, reqs, cur_kv_lens_cpu, nxt_kv_lens_cpu, **k):
        return plan_rows(reqs, cur_kv_lens_cpu.tolist(), nxt_kv_lens_cpu.tolist(), resolver)

    def of_batch(batch, *a, **k):
        return batch.tree_cache.token_to_kv_pool_allocator

    def of_tree(tree_cache, *a, **k):
        return tree_cache.token_to_kv_pool_allocator

    replace_everywhere({extend: _planned(extend, extend_rows, of_batch), decode: _planned(decode, decode_rows, of_batch),
                        spec: _planned(spec, spec_rows, of_tree)})


def _install_release(resolver):
    """``mem_cache.common.release_kv_cache`` and ``maybe_cache_unfinished_req``: every free inside is the
    request's (its own holds only: a slot it does not hold is refused), its row segments are freed from
    its page list, and what the tree cache keeps of it becomes the cache's (:func:`_install_tree_cache`).
    After a release, what the request still holds (SGLang neither freed it nor cached it) is released; the end of
    a request that finished (by the next step boundary: SGLang aborts some after their release) is recorded in the
    audit trail, when one is attached, under its ``rid``."""
    module = "sglang.srt.mem_cache.common"
    finish_abort = hooks.lookup("sglang.srt.managers.schedule_batch", "FINISH_ABORT")
    orig = hooks.expect(hooks.lookup(module, "release_kv_cache"), f"{module}.release_kv_cache", ("req", "tree_cache"))
    unfinished = hooks.expect(hooks.lookup(module, "maybe_cache_unfinished_req"), f"{module}.maybe_cache_unfinished_req",
                              ("req", "tree_cache"))

    @functools.wraps(orig)
    def release_kv_cache(req, tree_cache, *a, **k):
        alloc = _kvshield(tree_cache.token_to_kv_pool_allocator)
        if alloc is None:
            return orig(req, tree_cache, *a, **k)
        tenant = resolver.resolve_request(req)
        with alloc.releasing(tenant, req, leftovers=True):
            out = orig(req, tree_cache, *a, **k)
        if alloc._audited and not _streaming(req):  # NOTE: a session's turns end with the session
            alloc.request_released(req, tenant, outcome)
        return out

    def outcome(req):
        return isinstance(req.finished_reason, finish_abort) if req.finished() else None

    @functools.wraps(unfinished)
    def maybe_cache_unfinished_req(req, tree_cache, *a, **k):
        alloc = _kvshield(tree_cache.token_to_kv_pool_allocator)
        if alloc is None:
            return unfinished(req, tree_cache, *a, **k)
        with alloc.releasing(resolver.resolve_request(req), req):
            return unfinished(req, tree_cache, *a, **k)

    release_kv_cache._kvshield = True
    maybe_cache_unfinished_req._kvshield = True
    replace_everywhere({orig: release_kv_cache, unfinished: maybe_cache_unfinished_req})


def _install_pp_profiler(resolver):
    """``SchedulerPPMixin.profile_and_init_predictor`` (``Scheduler.__init__`` runs it with
    ``--enable-dynamic-chunking`` and pipeline parallelism): it prefills sample requests one at a time and frees
    each one's KV itself (``token_to_kv_pool_allocator.free``), outside any release. Inside it, a free is the
    release of the sample request built last: its own holds only (another holder's slot is refused); what the
    samples still hold when it returns or fails is released."""
    module = "sglang.srt.managers.scheduler"
    Scheduler = hooks.lookup(module, "Scheduler")
    orig = hooks.expect(hooks.lookup(module, "Scheduler.profile_and_init_predictor"),
                        "Scheduler.profile_and_init_predictor", ("self",))
    if getattr(orig, "_kvshield", False):
        return

    @functools.wraps(orig)
    def profile_and_init_predictor(self, *a, **k):
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        if alloc is None:
            return orig(self, *a, **k)
        stock_free = alloc.free
        with engine_hooks.building() as samples:
            def free(free_index):
                if not samples.built:
                    return stock_free(free_index)
                req = samples.built[-1]
                with alloc.releasing(resolver.resolve_request(req), req):
                    return stock_free(free_index)

            alloc.free = free  # NOTE: this allocator only, for this call only
            try:
                return orig(self, *a, **k)
            finally:
                del alloc.free
                for req in samples.built:  # NOTE: whatever a sample still holds (a failed sample, a short free)
                    alloc.release_leftovers(req, resolver.resolve_request(req))

    profile_and_init_predictor._kvshield = True
    Scheduler.profile_and_init_predictor = profile_and_init_predictor
    hooks.bound(Scheduler, "profile_and_init_predictor", getattr(Scheduler, "profile_and_init_predictor"))


_RADIX_TREES = (("sglang.srt.mem_cache.radix_cache", "RadixCache"),
                ("sglang.srt.mem_cache.unified_radix_cache", "UnifiedRadixCache"))


def _install_tree_cache(resolver):
    """SGLang's radix trees (``RadixCache``, ``UnifiedRadixCache``): ``insert`` hands what the tree kept of
    a request (``value[prefix_len:]``) to the cache's holds, and the frees inside ``evict`` present those
    holds; no other free outside a request's release can."""
    for module, name in _RADIX_TREES:
        cls = hooks.lookup(module, name)
        insert = hooks.expect(cls.insert, f"{module}.{name}.insert", ("self", "params"))
        evict = hooks.expect(cls.evict, f"{module}.{name}.evict", ("self", "params"))
        if not getattr(insert, "_kvshield", False):
            cls.insert = _kept_on_insert(insert)
        if not getattr(evict, "_kvshield", False):
            cls.evict = _evicting(evict)
        hooks.bound(cls, "insert", cls.insert)
        hooks.bound(cls, "evict", cls.evict)


def _kept_on_insert(orig):
    @functools.wraps(orig)
    def insert(self, params, *a, **k):
        result = orig(self, params, *a, **k)
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        value = getattr(params, "value", None)
        if alloc is not None and value is not None and result is not None:
            alloc.tree_kept(value[int(result.prefix_len):])
        return result

    insert._kvshield = True
    return insert


def _evicting(orig):
    @functools.wraps(orig)
    def evict(self, params, *a, **k):
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        if alloc is None:
            return orig(self, params, *a, **k)
        with alloc.evicting():
            return orig(self, params, *a, **k)

    evict._kvshield = True
    return evict


def _streaming(req):
    """Whether ``req`` is a turn of an SGLang streaming session (as ``streaming_session._is_streaming`` says)."""
    session = getattr(req, "session", None) if req is not None else None
    return session is not None and session.streaming


def _live_turn(session):
    """The turn of ``session`` let onto its KV at a match that has not been released yet (None: none). A strong
    reference, as SGLang's in-flight flag: garbage collection never decides it, so every rank agrees."""
    return getattr(session, "kvshield_turn", None)


_LIVE_SESSIONS = set()  # sessions of this process with a live turn: what a drop from the waiting queue checks


def _set_live_turn(session, req):
    """Makes ``req`` (None: none) the live turn of ``session``."""
    session.kvshield_turn = req
    if req is None:
        _LIVE_SESSIONS.discard(session)
    else:
        _LIVE_SESSIONS.add(session)


def _detaching_dropped_turns(orig):
    """``orig``, a ``Scheduler`` method that drops requests from its waiting queue without releasing them (a client's
    abort, the waiting timeout, the queue limit's preemption): a live turn it drops (matched, so restored onto its
    session's slot, never admitted) is never released, so it is detached there as SGLang detaches a turn aborted
    before its prefill (no longer the live turn, its own pool id, the slot's row dropped); else every later turn of
    the session would be refused as a second live turn and its close deferred for good, its KV held for good."""

    @functools.wraps(orig)
    def dropping(self, *a, **k):
        if not _LIVE_SESSIONS:  # NOTE: the scheduler loop runs the waiting timeout each step: no scan then
            return orig(self, *a, **k)
        waiting = self.waiting_queue
        queued = [s.kvshield_turn for s in _LIVE_SESSIONS if s.kvshield_turn in waiting]
        try:
            return orig(self, *a, **k)
        finally:
            for req in queued:  # NOTE: no pool crossing below, so the set's order cannot split ranks
                if _live_turn(req.session) is req and req not in self.waiting_queue:
                    _detach_turn(self.tree_cache, req)

    return dropping


def _detach_turn(tree_cache, req):
    """``req``, the live turn of its session, left SGLang's scheduler without a release."""
    session = req.session
    _set_live_turn(session, None)
    alloc = _kvshield(tree_cache.token_to_kv_pool_allocator)
    if alloc is not None:
        alloc.leave_session(req, session)
    _drop_slot_state(req, _streaming_slots(tree_cache).get(session.session_id))


def _kept_for_another(slot, session):
    """Whether streaming ``slot`` keeps the KV of another ``Session`` object than ``session`` (a closed session of the
    same id, released at its running turn's end)."""
    kept_for = getattr(slot, "kvshield_session", None)
    return kept_for is not None and kept_for is not session


def _leave_closed_session(alloc, req, session):
    """The deferred close of ``session`` ran at its live turn ``req``'s release: a turn SGLang retracted (not finished)
    runs again, as a plain request (the session is gone), else its next release would build a slot for the closed
    session that nothing ever releases."""
    if not req.finished():
        alloc.leave_session(req, session)
        req.session = None


def _drop_slot_state(req, slot):
    """``req`` no longer carries what ``restore_to_req`` put on it from ``slot`` (its row, KV info): SGLang would
    reuse that row at its prefill and return it to ``free_slots`` at its release while the slot still names it."""
    if slot is not None and req.req_pool_idx is not None and req.req_pool_idx == slot.req_pool_idx:
        req.req_pool_idx, req.kv, req.kv_committed_len = None, None, 0
        req.swa_uuid_for_lock, req.skip_lock_node_ids = None, {}
        req.mamba_pool_idx = req.mamba_ping_pong_track_buffer = req.mamba_next_track_idx = None
        req.mamba_last_track_idx = req.mamba_last_track_seqlen = req.mamba_branching_seqlen = None


def _abort_unprefilled(req, why):
    """Aborts ``req`` (SGLang's ``set_finish_with_abort``: a one-token input; unless already aborted) once
    ``init_next_round_input`` has built its fill ids from its whole input, and rebuilds them from the one-token
    input, as that call would have after an abort (SGLang sizes and allocates the prefill from them). Returns
    whether it aborted ``req`` now."""
    from array import array

    aborting = req.to_finish is None
    if aborting:
        req.set_finish_with_abort(why)
    fill = array("q", req.origin_input_ids)
    fill.extend(req.output_ids)
    req.full_untruncated_fill_ids = fill
    return aborting


def _refuse_turn(req, session, why, clear_inflight, owner=None):
    """Aborts ``req`` (unless already aborted) and detaches it from ``session`` with a fresh one-token input:
    ``Session.create_req`` built it on the session's token arrays (shared), which it must neither match on nor
    prefill. ``clear_inflight``: ``req`` is the session's in-flight turn (not another, still running one). ``why``
    reaches the request's client (SGLang returns the abort message), so it names nothing of another tenant; the
    server's log also names the session's ``owner`` tenant."""
    logger.warning("kvshield: request %s: %s%s: aborted", req.rid, why,
                   "" if owner is None else f" (the session's tenant: {owner})")
    if _abort_unprefilled(req, why) and clear_inflight:
        session.abort_req()
    req.session = None
    req.origin_input_ids_unpadded = req.origin_input_ids  # NOTE: set_finish_with_abort's stub, not shared


def _no_match(streaming, params):
    """The match of a refused turn: the inner cache's miss (the tree's root) on an empty key, never the session's
    history its key names."""
    return streaming.inner.match_prefix(dataclasses.replace(params, key=params.key[:0]))


def _install_streaming_sessions(resolver):
    """SGLang's ``StreamingSession`` (embedded in ``UnifiedRadixCache``, or wrapping another tree cache): a
    session keeps a finished turn's KV in its slot, neither freed nor cached, for its next turn (a new ``Req``).
    Each session is one pool holder of one tenant, the ``Session`` object: every turn serves as it
    (``serve_as``, at the turn's match, before it allocates), so the KV the slot keeps stays the session's
    between turns (``session_kept``: no leftovers release) and the next turn extends and reads it. At most one
    turn of a session is live (matched, not yet released): it shares the slot's row and its pages are the
    session's, so a second turn (SGLang lets one in after ``find_active_slot`` cleared the in-flight flag for a
    pre-aborted request, or a retracted turn comes back) is refused at its match, and a ``release_session``
    while a turn is live (a close) waits for that turn's release. The session is the tenant's that opened it
    (:func:`_install_session_control`) or of its first turn; a turn of another tenant is aborted and detached
    before it reads anything, and matches nothing; so is a turn of another ``Session`` than the one the slot was
    kept for (an id reopened while a closed session's turn still runs). A turn detached after its match drops the
    slot's row.
    ``_free_tail`` (at the match) and ``release_session`` (close, or a mid-turn abort inside the turn's
    release) free the session's holds."""
    cls = hooks.lookup("sglang.srt.session.streaming_session", "StreamingSession")
    match = hooks.expect(cls.try_match_prefix, "StreamingSession.try_match_prefix", ("self", "params"))
    finished = hooks.expect(cls.try_cache_finished_req, "StreamingSession.try_cache_finished_req",
                            ("self", "req", "is_insert"))
    release = hooks.expect(cls.release_session, "StreamingSession.release_session", ("self", "session_id"))
    scheduler = hooks.lookup("sglang.srt.managers.scheduler", "Scheduler")
    drops = [(name, hooks.expect(getattr(scheduler, name), f"Scheduler.{name}", params))
             for name, params in (("abort_request", ("self", "recv_req")), ("_abort_on_waiting_timeout", ("self",)),
                                  ("_abort_on_queued_limit", ("self", "recv_req")))]
    if getattr(match, "_kvshield", False):
        return
    from .prefix_cache import unlocking

    @functools.wraps(match)
    def try_match_prefix(self, params, *a, **k):
        req = params.req
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        if alloc is None or not _streaming(req):
            return match(self, params, *a, **k)
        session, tenant = req.session, resolver.resolve_request(req)
        slot = self.slots.get(session.session_id)
        owner, live = getattr(session, "kvshield_tenant", None), _live_turn(session)
        if owner is not None and owner != tenant:  # NOTE: a session is one tenant's; never read or free its KV
            _refuse_turn(req, session, f"tenant {tenant} names streaming session {session.session_id} of another tenant",
                         clear_inflight=live is None, owner=owner)
            return _no_match(self, params)
        if _kept_for_another(slot, session):  # NOTE: a closed session's slot, its turn still running
            _refuse_turn(req, session, f"streaming session {session.session_id} is a reopened id whose earlier session's"
                                       " KV is still held", clear_inflight=live is None)
            return _no_match(self, params)
        if live is not None and live is not req:  # NOTE: it would share and free the live turn's row and pages
            _refuse_turn(req, session, f"streaming session {session.session_id} has a running turn {live.rid}",
                         clear_inflight=False)
            return _no_match(self, params)
        if req.to_finish is not None:  # NOTE: refused at creation, or aborted before its prefill: never a turn
            if slot is not None and slot.kv is not None:  # NOTE: SGLang detaches it here
                if live is req:
                    _set_live_turn(session, None)
                alloc.leave_session(req, session)
                _drop_slot_state(req, slot)
            return match(self, params, *a, **k)
        session.kvshield_tenant = tenant
        alloc.serve_as(req, session)
        _set_live_turn(session, req)
        if slot is None or slot.kv is None:
            return match(self, params, *a, **k)
        with alloc.releasing(tenant, req):  # NOTE: _free_tail frees the session's orphaned tail
            return match(self, params, *a, **k)

    @functools.wraps(finished)
    def try_cache_finished_req(self, req, is_insert=True, *a, **k):
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        session = req.session if alloc is not None and _streaming(req) else None
        if session is None:
            return finished(self, req, is_insert, *a, **k)
        if _live_turn(session) is req:
            _set_live_turn(session, None)
        self.kvshield_finishing = session  # NOTE: a first turn's mid-turn abort releases a slot SGLang builds inside
        try:
            with unlocking(session):  # NOTE: a mid-turn abort's release_session unlocks the session's tree lock
                handled = finished(self, req, is_insert, *a, **k)
        finally:
            self.kvshield_finishing = None
        slot = self.slots.get(session.session_id)
        if handled and slot is not None and slot.kv is not None:
            slot.kvshield_session = session
            if getattr(slot, "kvshield_closing", False):  # NOTE: closed while this turn ran: release it now
                self.release_session(session.session_id)
                _leave_closed_session(alloc, req, session)
            else:
                alloc.session_kept(req, session)
        return handled

    @functools.wraps(release)
    def release_session(self, session_id, *a, **k):
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        slot = self.slots.get(session_id)
        session = getattr(slot, "kvshield_session", None)
        finishing = getattr(self, "kvshield_finishing", None)
        if session is None and slot is not None and finishing is not None and finishing.session_id == session_id:
            session = finishing  # NOTE: the slot SGLang built for a first turn's mid-turn abort, released in its release
        if alloc is None or session is None:
            return release(self, session_id, *a, **k)
        live = _live_turn(session)
        if live is not None:  # NOTE: the live turn reads and extends the slot's row: released at its release
            logger.warning("kvshield: streaming session %s released while its turn %s runs: deferred to the turn's"
                           " end", session_id, live.rid)
            slot.kvshield_closing = True
            return None
        with unlocking(session):  # NOTE: the slot's tree lock is the session's, not the node's latest one
            alloc.request_finished(session, session.kvshield_tenant, False, f"session:{session_id}")
            if alloc._releasing_request >= 0:  # NOTE: a mid-turn abort or a deferred close: inside its turn's release
                return release(self, session_id, *a, **k)
            with alloc.releasing(session.kvshield_tenant, session, leftovers=True):
                return release(self, session_id, *a, **k)

    for fn in (try_match_prefix, try_cache_finished_req, release_session):
        fn._kvshield = True
    cls.try_match_prefix, cls.try_cache_finished_req, cls.release_session = (
        try_match_prefix, try_cache_finished_req, release_session)
    for name, fn in drops:
        setattr(scheduler, name, _detaching_dropped_turns(fn))
        hooks.bound(scheduler, name, getattr(scheduler, name))


def _streaming_slots(tree_cache):
    """{session id: slot} of the streaming sessions ``tree_cache`` keeps KV for (SGLang's ``StreamingSession``,
    wrapping a tree cache or embedded in ``UnifiedRadixCache``); empty for a cache without one."""
    from sglang.srt.session.streaming_session import StreamingSession

    streaming = tree_cache if isinstance(tree_cache, StreamingSession) else getattr(tree_cache, "session", None)
    return streaming.slots if isinstance(streaming, StreamingSession) else {}


def _radix_session_users(scheduler):
    """{radix-native session id never opened: the tenant of its first request} of ``scheduler``
    (``--enable-session-radix-cache``: SGLang pins a request's leaves under a top-level ``session_id`` it was never
    told to open); an entry lives until a close of that tenant's names the id."""
    return scheduler.__dict__.setdefault("kvshield_radix_session_users", {})


def _install_session_control(resolver):
    """Opening and closing a session (``OpenSessionReqInput``, ``CloseSessionReqInput``: ``TokenizerManager``'s
    ``open_session``/``close_session`` get the HTTP request, ``Scheduler.open_session``/``close_session`` act):
    the tokenizer side resolves the tenant from the headers as for a generate request and seals it, bound to the
    session id, into the request's ``rid`` (a msgspec Struct takes no extra attribute; SGLang never reads an open
    or close request's ``rid``); the scheduler opens it and puts the original back. An open binds the session to
    its tenant (``session.kvshield_tenant``); a close from another tenant is refused, the session untouched. An
    envelope that does not verify is the default tenant's, as for a generate request. ``Session.create_req``
    (every session kind: it builds a turn on an earlier turn's tokens, adds it to the session's request tree, or
    clears that tree) refuses a request of another tenant than the session's (bound at open, else by its first
    turn) before it touches the session: the request is built on a blank stand-in session (its own input only),
    aborted and detached (:func:`_refuse_turn`). An open naming an id whose streaming slot is still held (a closed
    session's, released at its running turn's end) is refused. A radix-native session's request (``--enable-session-radix-cache``,
    a top-level ``session_id``) naming another tenant's session is aborted and detached likewise, before its
    leaves join that session's radix refs; an id never opened is its first request's tenant's
    (:func:`_radix_session_users`): another tenant's request, open or close naming it is refused."""
    import uuid

    channel = TenantChannel.from_rank_dir()
    tm_module, sched_module = "sglang.srt.managers.tokenizer_manager", "sglang.srt.managers.scheduler"
    manager, scheduler = hooks.lookup(tm_module, "TokenizerManager"), hooks.lookup(sched_module, "Scheduler")
    tm_open = hooks.expect(manager.open_session, "TokenizerManager.open_session", ("self", "obj", "request"))
    tm_close = hooks.expect(manager.close_session, "TokenizerManager.close_session", ("self", "obj", "request"))
    s_open = hooks.expect(scheduler.open_session, "Scheduler.open_session", ("self", "recv_req"))
    s_close = hooks.expect(scheduler.close_session, "Scheduler.close_session", ("self", "recv_req"))
    session_cls = hooks.lookup("sglang.srt.session.session_controller", "Session")
    create = hooks.expect(session_cls.create_req, "Session.create_req", ("self", "req", "tokenizer", "vocab_size"))
    hooks.expect(session_cls.__init__, "Session.__init__", ("self", "capacity_of_str_len", "session_id"),
                 ("streaming",))
    built = hooks.expect(scheduler._maybe_namespace_elastic_radix_cache,
                         "Scheduler._maybe_namespace_elastic_radix_cache", ("self", "req"))
    if getattr(s_close, "_kvshield", False):
        return

    def sealing(orig):
        @functools.wraps(orig)
        async def handler(self, obj, request=None, *a, **k):
            headers = getattr(request, "headers", None) if request is not None else None
            tenant = resolver.resolve_http(headers) if headers is not None else None
            if obj.session_id is None:  # NOTE: SGLang would mint it after this point; the seal names it
                obj.session_id = uuid.uuid4().hex
            obj.rid = channel.seal(f"session:{obj.session_id}", tenant, obj.rid)
            return await orig(self, obj, request, *a, **k)

        return handler

    def received(recv_req):
        sealed, tenant, original = channel.open(f"session:{recv_req.session_id}", recv_req.rid)
        if sealed:
            recv_req.rid = original
        return (tenant if sealed else None) or resolver.default_tenant

    @functools.wraps(s_open)
    def open_session(self, recv_req, *a, **k):
        tenant = received(recv_req)
        user = _radix_session_users(self).get(recv_req.session_id)
        held = recv_req.session_id in _streaming_slots(self.tree_cache)
        if held or (user is not None and user != tenant):  # NOTE: a closed session's KV, or radix refs of another's
            logger.error("kvshield: tenant %s's open of session %s refused: %s", tenant, recv_req.session_id,
                         "its earlier session's KV is still held" if held else f"its radix refs are tenant {user}'s")
            from sglang.srt.managers.io_struct import OpenSessionReqOutput

            if self.ps.pp_rank == 0 and self.ps.tp_rank == 0 and self.ps.attn_cp_rank == 0:  # NOTE: as SGLang answers
                return OpenSessionReqOutput(session_id=recv_req.session_id, success=False)
            return None
        out = s_open(self, recv_req, *a, **k)
        session = self.session_controller.get(recv_req.session_id)
        if session is not None and getattr(session, "kvshield_tenant", None) is None:
            session.kvshield_tenant = tenant
        return out

    @functools.wraps(s_close)
    def close_session(self, recv_req, *a, **k):
        tenant = received(recv_req)
        session = self.session_controller.get(recv_req.session_id)
        users = _radix_session_users(self)
        owner = getattr(session, "kvshield_tenant", None) if session is not None else users.get(recv_req.session_id)
        if (session is not None or owner is not None) and owner != tenant:  # NOTE: unbound (None) is no tenant's
            logger.error("kvshield: tenant %s's close of session %s (tenant %s): refused, session untouched",
                         tenant, recv_req.session_id, owner)
            return None
        users.pop(recv_req.session_id, None)
        return s_close(self, recv_req, *a, **k)

    @functools.wraps(create)
    def create_req(self, req, *a, **k):
        tenant = engine_hooks.building_tenant() or resolver.default_tenant
        owner = getattr(self, "kvshield_tenant", None)
        if owner is None:
            self.kvshield_tenant = owner = tenant
        if owner == tenant:
            return create(self, req, *a, **k)
        # NOTE: the stand-in holds none of the session's turns, tree or in-flight flag: none reach the request
        stand_in = session_cls(self.capacity_of_str_len, self.session_id, streaming=self.streaming)
        new_req = create(stand_in, req, *a, **k)
        _refuse_turn(new_req, stand_in, f"tenant {tenant} names session {self.session_id} of another tenant",
                     clear_inflight=True, owner=owner)
        return new_req

    @functools.wraps(built)
    def radix_session_checked(self, req, *a, **k):
        # NOTE: the first call after handle_generate_request built the Req on either path; a radix-native
        # session's request (top-level session_id) never passes create_req, yet its leaves join the session's refs
        session = self.session_controller.get(req.session_id) if req.session_id is not None else None
        owner, tenant = getattr(session, "kvshield_tenant", None), resolver.resolve_request(req)
        if session is None and req.session_id is not None and self.enable_session_radix_cache:
            # NOTE: never opened: SGLang keys its radix refs by the id at first use; the id is its first user's
            owner = _radix_session_users(self).setdefault(req.session_id, tenant)
        if owner is not None and owner != tenant:
            _refuse_turn(req, session, f"tenant {tenant} names radix session {req.session_id} of another tenant",
                         clear_inflight=False, owner=owner)
            req.session_id = None
        return built(self, req, *a, **k)

    manager.open_session, manager.close_session = sealing(tm_open), sealing(tm_close)
    scheduler.open_session, scheduler.close_session = open_session, close_session
    scheduler._maybe_namespace_elastic_radix_cache = radix_session_checked
    session_cls.create_req = create_req
    hooks.bound(session_cls, "create_req", getattr(session_cls, "create_req"))
    for fn in (manager.open_session, manager.close_session, open_session, close_session, create_req,
               radix_session_checked):
        fn._kvshield = True


def _install_scheduler_ranks(resolver):
    """``Scheduler.__init__``: the tensor, data and pipeline parallel ranks SGLang passes this process's
    scheduler name its rank (the allocator is built inside)."""
    Scheduler = hooks.lookup("sglang.srt.managers.scheduler", "Scheduler")
    orig = hooks.expect(Scheduler.__init__, "Scheduler.__init__",
                        ("self", "server_args", "port_args", "gpu_id", "tp_rank", "moe_ep_rank", "pp_rank",
                         "attn_cp_rank", "moe_dp_rank", "dp_rank"))

    @functools.wraps(orig)
    def __init__(self, server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, attn_cp_rank, moe_dp_rank,
                 dp_rank, *a, **k):
        hooks.set_scheduler_ranks(tp_rank, dp_rank, pp_rank, ranks.server_of(server_args))
        hooks.attempt("serving-gate", functools.partial(refuse_ungated_launcher, server_args))
        _stop_unless_every_hook()
        return orig(self, server_args, port_args, gpu_id, tp_rank, moe_ep_rank, pp_rank, attn_cp_rank, moe_dp_rank,
                    dp_rank, *a, **k)

    Scheduler.__init__ = __init__
    hooks.bound(Scheduler, "__init__", getattr(Scheduler, "__init__"))


# server_args settings under which ranks serve that kvshield's every-rank gate (``Engine._launch_subprocesses``,
# ``_wait_and_warmup``) never checks, or requests reach the schedulers past ``TokenizerManager`` (no tenant sealed):
# (attribute, flag, why).
_SMG = ("smg-grpc-servicer starts the schedulers with its own launcher, past the every-rank serving gate, and hands"
        " them requests past TokenizerManager, where no tenant is sealed (SGLang's native gRPC server, --grpc-port,"
        " serves beside the HTTP one and is gated)")
_ELASTIC = ("elastic EP lets scheduler ranks join the running server (scale-up, recovery) after the every-rank serving"
            " gate checked it")
UNGATED_LAUNCHERS = (("smg_grpc_mode", "--smg-grpc-mode", _SMG), ("grpc_mode", "--grpc-mode", _SMG),
                     ("elastic_ep_backend", "--elastic-ep-backend", _ELASTIC),
                     ("ep_join_mode", "--elastic-ep-join-mode", _ELASTIC))


def refuse_ungated_launcher(server_args):
    """Raises naming each setting of :data:`UNGATED_LAUNCHERS` that ``server_args`` sets (as SGLang tests it: not
    None, not False): checked in every scheduler, since the launcher that would have to refuse is not SGLang's
    HTTP or ``Engine`` one, or has already passed its gate."""
    on = [f"{flag} {getattr(server_args, attr)!r}: {why}" for attr, flag, why in UNGATED_LAUNCHERS
          if getattr(server_args, attr, None) not in (None, False)]
    if on:
        raise hooks.HookError("kvshield refuses to serve under " + "; ".join(on))


def _stop_unless_every_hook():
    """Stops this scheduler before it builds anything when a hook failed in its process, recording its rank inactive
    with each failed hook: the allocator reports the same when it is built, but with the ``allocators`` hook failed
    SGLang builds its own, and that rank would go on with nothing naming the hook."""
    import os

    from .errors import UnsupportedFeatureError

    failed = hooks.failed()
    if failed:
        name = os.environ.get("KVSHIELD_RANK_NAME") or ranks.rank_name(*hooks.rank_identity())
        ranks.report(name, False, "scheduler stopped before its allocator was built", hooks=hooks.results(),
                     server=hooks.scheduler_server(),
                     problems=failed)
        raise UnsupportedFeatureError("kvshield cannot protect this rank; hooks not installed: " + "; ".join(failed))


def _install_input_limits(resolver):
    """``Scheduler.init_model_worker`` (it builds the pools and reads SGLang's request limits): afterwards
    SGLang's input limit agrees with the pool's effective limit (the tokenizer learns it from the scheduler)."""
    Scheduler = hooks.lookup("sglang.srt.managers.scheduler", "Scheduler")
    orig = hooks.expect(hooks.lookup("sglang.srt.managers.scheduler", "Scheduler.init_model_worker"),
                        "Scheduler.init_model_worker", ("self",))

    @functools.wraps(orig)
    def init_model_worker(self, *a, **k):
        out = orig(self, *a, **k)
        from .allocator import agree_input_limit

        _, alloc = self.tp_worker.get_memory_pool()
        if hasattr(alloc, "admission_limits"):
            agree_input_limit(self, alloc)
        return out

    Scheduler.init_model_worker = init_model_worker
    hooks.bound(Scheduler, "init_model_worker", getattr(Scheduler, "init_model_worker"))


def serving_gate(server_args, timeout_s=30.0):
    """Raises RankNotProtectedError unless every scheduler rank of ``server_args`` reported kvshield active."""
    dp_attention = bool(getattr(server_args, "enable_dp_attention", False))
    expected = ranks.expected_ranks(getattr(server_args, "tp_size", 1) or 1, getattr(server_args, "dp_size", 1) or 1,
                                    getattr(server_args, "pp_size", 1) or 1, dp_attention)
    return ranks.verify(expected, timeout_s=timeout_s, server=ranks.server_of(server_args))


def _install_serving_gate(resolver):
    """Every rank or none, in the launching process: after ``Engine._launch_subprocesses`` (every launcher SGLang
    ships starts its schedulers there: the HTTP and Ray servers, the offline ``Engine``, the native gRPC and Rust
    servers (``--smg-grpc-mode``, which does not, is refused in every scheduler: :func:`refuse_ungated_launcher`);
    it returns once each scheduler is ready, its allocator built and its rank reported) and again at
    ``http_server._wait_and_warmup`` (before the HTTP server's warm-up). Both targets or neither."""
    import os

    module = "sglang.srt.entrypoints.http_server"
    orig = hooks.expect(hooks.lookup(module, "_wait_and_warmup"), f"{module}._wait_and_warmup", ("server_args",))
    engine = hooks.lookup("sglang.srt.entrypoints.engine", "Engine")
    launch = hooks.expect(engine._launch_subprocesses, "Engine._launch_subprocesses", ("server_args",))
    if not isinstance(inspect.getattr_static(engine, "_launch_subprocesses"), classmethod):
        raise hooks.HookError("Engine._launch_subprocesses is not a classmethod")
    if getattr(launch, "_kvshield", False):
        return

    @functools.wraps(orig)
    def wrapper(server_args, *a, **k):
        try:
            serving_gate(server_args)
        except Exception as e:  # noqa: BLE001  (any failure of the gate must stop the server)
            logger.error("kvshield: %s", e)
            try:
                from sglang.srt.utils import kill_process_tree

                kill_process_tree(os.getpid())
            finally:
                os._exit(1)
        return orig(server_args, *a, **k)

    @functools.wraps(launch.__func__)
    def launch_subprocesses(cls, server_args, *a, **k):
        out = launch.__func__(cls, server_args, *a, **k)
        if getattr(server_args, "node_rank", 0) == 0:  # NOTE: other nodes serve nothing; they return when their ranks exit
            serving_gate(server_args)  # NOTE: raises into the launcher, which then stops its children
        return out

    launch_subprocesses._kvshield = True
    engine._launch_subprocesses = classmethod(launch_subprocesses)
    hooks.bound(engine, "_launch_subprocesses", getattr(engine, "_launch_subprocesses"))
    replace_everywhere({orig: wrapper})


def _install_tenant_quota(resolver):
    """``PrefillAdder.add_one_req``: a tenant quota is a per-request outcome, never a failed batch allocation
    (SGLang's ``allocation.py`` raises on ``None``). A request is admitted only if its tenant's quota holds
    its worst case (``tenants.worst_case_pages``: the pages it may still take) beside the worst case of the
    tenant's running, chunked and already admitted requests; otherwise it stays waiting (other tenants'
    requests are admitted past it). When nothing runs at all, the queued frees reach the pool and the tree cache
    is asked to evict the shortfall (least recently used first, any tenant's, as SGLang evicts for an
    allocation) before the request is made to wait. One whose whole sequence (``tenants.request_pages``) exceeds
    the tenant's whole quota is aborted (SGLang's ``set_finish_with_abort``: 400) and matched again on its one-token input, as
    SGLang leaves a request aborted before its match: a one-token prefill, admitted as soon as the tenant has a
    page."""
    module = "sglang.srt.managers.schedule_policy"
    PrefillAdder = hooks.lookup(module, "PrefillAdder")
    result = hooks.lookup(module, "AddReqResult")
    evict_params = hooks.lookup("sglang.srt.mem_cache.base_prefix_cache", "EvictParams")
    orig = hooks.expect(hooks.lookup(module, "PrefillAdder.add_one_req"), "PrefillAdder.add_one_req",
                        ("self", "req", "has_chunked_req", "truncation_align_size"))

    @functools.wraps(orig)
    def add_one_req(self, req, has_chunked_req, truncation_align_size, *a, **k):
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        quota = None if alloc is None else alloc.tenant_quota_pages(resolver.resolve_request(req))
        if quota is None:
            return orig(self, req, has_chunked_req, truncation_align_size, *a, **k)
        if self.dllm_config is not None:  # NOTE: held when it entered the dLLM manager (dllm-quota)
            return orig(self, req, has_chunked_req, truncation_align_size, *a, **k)
        tenant = resolver.resolve_request(req)
        committed = getattr(self, "_kvshield_quota", None)
        if committed is None:  # NOTE: once per admission pass: the worst case of the tenant's running requests
            # NOTE: can_run_list holds the chunked request SGLang continues this pass (add_chunked_req); the
            # running batch may still list requests finished last step (worst case 0)
            committed = self._kvshield_quota = _committed_pages(
                list(self.running_batch.reqs) + list(self.can_run_list), resolver, alloc.page_size)
        why = _never_fits(req, tenant, quota, alloc.page_size)
        if why is not None and _abort_unprefilled(req, why):
            # NOTE: matched on its whole input already: match its one-token input as SGLang does for a request
            # aborted before its match (its prefix, a streaming session's slot, are let go there)
            req.init_next_round_input(self.tree_cache)
        need = worst_case_pages(req, alloc.page_size)
        headroom = quota - alloc.tenant_owned_pages(tenant) - committed.get(tenant, 0)
        if need > headroom and not any(committed.values()):
            # NOTE: nothing runs or was admitted, so a waiting request's tenant owns only pages its released requests
            # queued as frees (they reach the pool at a step boundary, which an idle scheduler does not cross) and
            # what the tree cache keeps of it (evicted only for an allocation that finds the pool short). Neither
            # happens while every request waits: the server would stall for good. Idle, nothing is in flight to
            # wait for: the queue reaches the pool now, then the tree evicts the shortfall (SGLang's own eviction).
            alloc.resolve_frees()
            headroom = quota - alloc.tenant_owned_pages(tenant)
            if need > headroom:
                self.tree_cache.evict(evict_params(num_tokens=(need - headroom) * alloc.page_size))
                alloc.resolve_frees()
                headroom = quota - alloc.tenant_owned_pages(tenant)
        if _waits(req, tenant, need, headroom):
            return result.CONTINUE
        res = orig(self, req, has_chunked_req, truncation_align_size, *a, **k)
        if self.can_run_list and self.can_run_list[-1] is req:
            committed[tenant] = committed.get(tenant, 0) + need
        return res

    PrefillAdder.add_one_req = add_one_req
    hooks.bound(PrefillAdder, "add_one_req", getattr(PrefillAdder, "add_one_req"))


def _install_dllm_quota(resolver):
    """``SchedulerDllmMixin._fetch_waiting_reqs``: a diffusion LLM server's tenant quota is held where SGLang moves a
    request from its waiting queue into the dLLM manager, which runs it round by round to its end: each round
    allocates a block (``add_dllm_staging_req``, past ``add_one_req``), and while one of its requests waits to
    prefill no request decodes, so a request may not wait inside it. A request moves only if its tenant's quota
    holds its worst case (``tenants.worst_case_pages``) beside the worst case of the tenant's requests already
    there; otherwise it stays in the waiting queue (other tenants' requests move past it). One whose whole sequence
    (``tenants.request_pages``) exceeds the tenant's whole quota is aborted there (SGLang's
    ``set_finish_with_abort``: 400) and moves once the quota holds its abort's one round."""
    module = "sglang.srt.dllm.mixin.scheduler"
    mixin = hooks.lookup(module, "SchedulerDllmMixin")
    orig = hooks.expect(hooks.lookup(module, "SchedulerDllmMixin._fetch_waiting_reqs"),
                        "SchedulerDllmMixin._fetch_waiting_reqs", ("self",))

    @functools.wraps(orig)
    def _fetch_waiting_reqs(self, *a, **k):
        alloc = _kvshield(self.token_to_kv_pool_allocator)
        if alloc is None:
            return orig(self, *a, **k)
        manager = self.dllm_manager
        committed = _committed_pages(manager.waiting_queue, resolver, alloc.page_size)
        room = self.dllm_config.max_running_requests - len(manager.waiting_queue)
        moved, kept = [], []
        for req in self.waiting_queue:
            (moved if len(moved) < room and _dllm_quota_holds(req, alloc, resolver, committed) else kept).append(req)
        self.waiting_queue = moved  # NOTE: SGLang moves the queue's head, up to the manager's room: these
        try:
            return orig(self, *a, **k)
        finally:
            self.waiting_queue = self.waiting_queue + kept

    mixin._fetch_waiting_reqs = _fetch_waiting_reqs
    hooks.bound(mixin, "_fetch_waiting_reqs", getattr(mixin, "_fetch_waiting_reqs"))


def _dllm_quota_holds(req, alloc, resolver, committed):
    """Whether ``req``'s tenant quota holds its worst case beside ``committed`` (tenant -> pages the tenant's admitted
    requests may still take), which it then joins; aborts ``req`` (400) when its whole sequence exceeds the quota."""
    tenant = resolver.resolve_request(req)
    quota = alloc.tenant_quota_pages(tenant)
    if quota is None:
        return True
    why = _never_fits(req, tenant, quota, alloc.page_size)
    if why is not None and req.to_finish is None:
        req.set_finish_with_abort(why)
    need = worst_case_pages(req, alloc.page_size)
    if _waits(req, tenant, need, quota - alloc.tenant_owned_pages(tenant) - committed.get(tenant, 0)):
        return False
    committed[tenant] = committed.get(tenant, 0) + need
    return True


def _committed_pages(reqs, resolver, page_size):
    """Tenant -> the pages its requests among ``reqs`` may still take (``tenants.worst_case_pages``)."""
    committed = {}
    for r in reqs:
        t = resolver.resolve_request(r)
        committed[t] = committed.get(t, 0) + worst_case_pages(r, page_size)
    return committed


def _never_fits(req, tenant, quota, page_size):
    """The refusal of ``req`` when its whole sequence (``tenants.request_pages``, the tenant's at once) exceeds its
    tenant's whole quota, else None."""
    total = request_pages(req, page_size)
    if total <= quota:
        return None
    return f"request {req.rid} needs up to {total} KV pages; tenant {tenant}'s quota is {quota} pages"


def _waits(req, tenant, need, headroom):
    """Whether ``req`` must wait for its tenant's quota (``need`` pages, ``headroom`` left), logged when it does."""
    if need <= headroom:
        return False
    logger.info("kvshield: request %s of tenant %s waits: it may need %d pages, the tenant's quota has %d left",
                req.rid, tenant, need, headroom)
    return True


def _install_engine(name):
    def install(resolver):
        getattr(engine_hooks, name)(resolver)

    return install


def _install_disagg(name):
    def install(resolver):
        from . import disagg

        getattr(disagg, name)()

    return install


def _install_rebootstrap(resolver):
    """PD true-retraction rebootstrap: the decode server POSTs a retracted request (``Req.build_rebootstrap_payload``)
    to the prefill server's ``/generate`` (``CommonKVManager.submit_prefill_recompute``), a plain HTTP request past
    the gateway that carries no tenant header. The payload never carries the tenant's tree namespace: while tenants
    are configured its ``extra_key`` is the request's tenant and the client's value, bound to the whole payload and
    authenticated (not encrypted) under the deployment's recompute key
    (:class:`~kvshield_sglang.tenants.RecomputeChannel`), which the prefill server's tokenizer hook opens; without
    that key the recompute is refused on every rank, and the request fails through SGLang's own rebootstrap failure
    path (``_fail_prefill_recompute``: ``KVPoll.Failed``, aborted to its client) rather than run as the default
    tenant there. Without tenants it runs as SGLang's."""
    recompute = RecomputeChannel.from_env()
    req_cls = hooks.lookup("sglang.srt.managers.schedule_batch", "Req")
    manager = hooks.lookup("sglang.srt.disaggregation.common.conn", "CommonKVManager")
    build = hooks.expect(req_cls.build_rebootstrap_payload, "Req.build_rebootstrap_payload", ("self",))
    submit = hooks.expect(manager.submit_prefill_recompute, "CommonKVManager.submit_prefill_recompute",
                          ("self", "kv_receiver", "payload"))
    fail = hooks.expect(manager._fail_prefill_recompute, "CommonKVManager._fail_prefill_recompute",
                        ("self", "kv_receiver", "reason"))
    if getattr(build, "_kvshield", False):
        return

    @functools.wraps(build)
    def build_rebootstrap_payload(self, *a, **k):
        payload = build(self, *a, **k)
        extra_key = engine_hooks.client_extra_key(payload.get("extra_key"))
        if resolver.configured and recompute is not None:
            binding = RecomputeChannel.binding({k: v for k, v in payload.items() if k != "extra_key"})
            extra_key = recompute.seal(binding, resolver.resolve_request(self), extra_key)
        payload["extra_key"] = extra_key
        return payload

    @functools.wraps(submit)
    def submit_prefill_recompute(self, kv_receiver, payload, *a, **k):
        if not resolver.configured or recompute is not None:
            return submit(self, kv_receiver, payload, *a, **k)
        why = (f"kvshield: PD rebootstrap of request {payload.get('rid')} refused: without {RecomputeChannel.ENV}"
               " the prefill server would recompute it without its tenant")
        logger.error(why)
        return fail(self, kv_receiver, why)

    build_rebootstrap_payload._kvshield = submit_prefill_recompute._kvshield = True
    req_cls.build_rebootstrap_payload = build_rebootstrap_payload
    manager.submit_prefill_recompute = submit_prefill_recompute


def _install_prefill_sends(resolver):
    from . import disagg_prefill

    disagg_prefill.install_in_sglang()


def _install_radix_backend(resolver):
    from . import prefix_cache

    prefix_cache.register()


def _install_coverage(resolver):
    """SGLang's KV-cache configurator hands the allocator the server args and every KV pool sharing its
    slots (target and draft): every KV tensor is registered for protection or the rank refuses to start."""
    from . import coverage

    coverage.install()


def _install_allocators(resolver):
    """SGLang's ``TokenToKVPoolAllocator`` and ``PagedTokenToKVPoolAllocator``, in their modules and every
    module already holding them by name, replaced by kvshield's (constructor signatures checked)."""
    from . import allocator

    pairs = {}
    for module, name, params in (
            ("sglang.srt.mem_cache.allocator.token", "TokenToKVPoolAllocator",
             ("self", "size", "dtype", "device", "kvcache", "need_sort")),
            ("sglang.srt.mem_cache.allocator.paged", "PagedTokenToKVPoolAllocator",
             ("self", "size", "page_size", "dtype", "device", "kvcache", "need_sort"))):
        stock = hooks.lookup(module, name)
        hooks.expect(stock.__init__, f"{module}.{name}.__init__", params)
        ours = getattr(allocator, name)
        if not issubclass(ours, stock):
            raise hooks.HookError(f"kvshield's {name} does not subclass this SGLang's {module}.{name}")
        pairs[stock] = ours
    replace_everywhere(pairs)


# (hook name, installer): planning and release before the disaggregation hooks (which wrap the decode
# module's release_kv_cache, already the tenant-checked one); the allocator swap last.
HOOKS = (
    ("scheduler-ranks", _install_scheduler_ranks),
    ("tenant-tokenizer", _install_engine("install_tokenizer_side")),
    ("tenant-scheduler", _install_engine("install_scheduler_side")),
    ("tenant-aborts", _install_engine("install_abort_scoping")),
    ("forward-launch", _install_engine("install_forward_hook")),
    ("planning", _install_planning),
    ("release", _install_release),
    ("pp-profiler", _install_pp_profiler),
    ("tree-cache", _install_tree_cache),
    ("streaming-sessions", _install_streaming_sessions),
    ("session-control", _install_session_control),
    ("tenant-quota", _install_tenant_quota),
    ("dllm-quota", _install_dllm_quota),
    ("input-limits", _install_input_limits),
    ("serving-gate", _install_serving_gate),
    ("handoff-fix", _install_disagg("check_handoff_fix")),
    ("disagg-transports", _install_disagg("install_transports")),
    ("disagg-prefill-admission", _install_disagg("install_prefill_admission")),
    ("disagg-decode", _install_disagg("install_decode")),
    ("disagg-rebootstrap", _install_rebootstrap),
    ("disagg-prefill-sends", _install_prefill_sends),
    ("radix-backend", _install_radix_backend),
    ("kv-coverage", _install_coverage),
    ("allocators", _install_allocators),
)
