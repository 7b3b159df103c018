"""Hooks into SGLang's disaggregation queues (``sglang.srt.disaggregation``), probed by feature.

- Prefill (``PrefillBootstrapQueue.add``): a request already finished (rejected for length, shrunk to a
  placeholder) or longer than the pool's effective limit never enters the bootstrap queue; it is
  aborted with 400 and its error streamed to the client. The pool's limit is published for the
  handshake (:data:`kvshield_sglang.transport.LOOPBACK`).
  The request's KV sender is armed to write its coverage row into SGLang's metadata buffers
  (:func:`kvshield_sglang.transport.arm_sender`). A request whose bootstrap room another live request of
  this server holds is refused (400): SGLang's transports tell transfers apart by room alone, so two
  senders on one room write into one receiver's pages (:class:`LiveRooms`; the room is free once the
  first one's sender concluded, or it finished without sending).
- Decode admission (``DecodePreallocQueue.add``): the request's transport must publish coverage
  (:mod:`kvshield_sglang.transport`), it must carry a tenant, fit the effective limit and its tenant's quota
  (its worst case beside the tenant's requests already here), and its prefill
  peer must have shaken hands with equal limits (for transports that carry the limit in the metadata
  row, compared at commit), and its bootstrap room must not be another live request's on this server;
  otherwise it is aborted before anything is reserved. At commit, the coverage row's tenant must be the
  request's own. A no-transfer request (SGLang's fake bootstrap host: warmup, health check) is admitted
  without a reservation when its tenant's pages are scrubbed (``Handoff.admit_no_transfer``; refused
  under ``NONE``) and decodes over its own freshly allocated pages, never committed by kvshield; SGLang commits it
  from the metadata rows at its index, which are zeroed when its receiver is told the index
  (:func:`kvshield_sglang.transport.clear_rows_at_send`).
- Decode prealloc (``DecodePreallocQueue.pop_preallocated`` → ``alloc_for_decode_prealloc``): the KV
  slots handed to the receiver are a kvshield reservation (``Handoff.reserve``: pages, generations,
  writer claims) over exactly what SGLang preallocates for the request and its prefill sends (its input; for a PD
  rebootstrap its input and output so far, :func:`_fill_len`), which also sizes its admission limit check. A
  reservation SGLang's budget allowed but kvshield cannot make (too few claim slots, no room) aborts that one request
  (503, error streamed, its ``req_to_token`` row given back, nothing reserved); SGLang's prealloc assertions never see
  it. The requests SGLang preallocated before it in that pass (no-transfer ones too) leave the queue preallocated,
  once.
- Decode transfer (``DecodeTransferQueue.pop_transferred``): a request the transport reports
  transferred is committed against the coverage its transport published; a refusal aborts it (500,
  abort finish reason) instead of letting it decode over unwritten pages. Failed transfers and aborts
  (``release_kv_cache`` in the decode queues): SGLang's release first (its frees present the pending
  reservation's holds), then ``Handoff.abort`` (releases what it left); a reservation that already ended
  (refused at commit) had its pages released by the receiver, so SGLang's release runs without its frees.
- Decode retraction: a committed request retracted by SGLang finishes its handoff at its row free; resumed
  (``resume_retracted_reqs``: ``_pre_alloc`` outside ``pop_preallocated``, its KV from its host copy) it gets
  no second reservation but an ordinary allocation planned for its ``Req``, so its pages are its own.
- Acknowledgements: each reservation is acknowledged when its transport says nothing more will be
  written (its completion; for a transfer the decode side aborted under SGLang's deferred decode KV release, the
  drain acknowledgement of every prefill rank, :func:`_drained`); one given up on (failed, aborted, refused) that
  stays unacknowledged for ``KVSHIELD_HANDOFF_ACK_TIMEOUT_S`` seconds is expired (claims fenced, alarm, pages
  held back), never freed. Until then its bootstrap room stays busy (:func:`_forget`) and, over the metadata
  transports, its metadata index stays its own (:func:`kvshield_sglang.transport.hold_indices`): a late
  completion never reaches another request. A committed request is finished when SGLang frees its ``req_to_token`` row.

SGLang versions without the upstream handoff-isolation fix (the rejected-request check before
bootstrap) get a loud warning; under ``COMPLIANCE`` kvshield refuses to start on them unless
``KVSHIELD_ALLOW_UNFIXED_HANDOFF=1``.
"""

import contextvars
import importlib
import inspect
import logging
import os
import sys
import time
import weakref
from http import HTTPStatus

from . import consensus, hooks, settings, transport
from .errors import HandoffError, UnsupportedFeatureError
from .tenants import request_pages, worst_case_pages

logger = logging.getLogger(__name__)
ALLOW_UNFIXED = "KVSHIELD_ALLOW_UNFIXED_HANDOFF"
ACK_TIMEOUT = "KVSHIELD_HANDOFF_ACK_TIMEOUT_S"
DEFAULT_ACK_TIMEOUT_S = 60.0
# The _Pass reserving inside the current pop_preallocated (retraction's _pre_alloc reserves nothing).
_RESERVING = contextvars.ContextVar("kvshield_reserving", default=None)
# Req → the Handoff holding its reservation, for the hooks that see only the request.
_OWNER = weakref.WeakKeyDictionary()


class LiveRooms:
    """The bootstrap rooms of one side's live handoffs, each with its request. SGLang's transports key a
    transfer by room alone (Mooncake's ``transfer_infos[room]``, each sender's chunks written at its own
    progress), so a second live request on a room would write its KV into the first one's decode pages, or
    have the first one's written into its own; the tenant tag in the coverage row names only the row's writer.

    A room's holder is live while its transfer is under way (:meth:`busy` until :meth:`release`) or it has not
    finished: decided from the requests' own state, never from garbage collection, so every rank decides alike.
    Scheduler thread only.

    Implementation notes: holders are strong references, released explicitly where a transfer ends; a holder
    that finished without one (aborted before sending) is dropped when its room is claimed again or by the
    periodic prune, so the table stays as large as the live requests."""

    PRUNE_EVERY = 1024

    def __init__(self, side):
        self._side = side
        self._reqs = {}
        self._busy = set()
        self._claims = 0

    def _live(self, room, holder):
        return room in self._busy or getattr(holder, "finished_reason", None) is None

    def claim(self, req):
        """Records ``req``'s room; raises HandoffError (400) when another live request holds it."""
        room = getattr(req, "bootstrap_room", None)
        if room is None:
            return
        holder = self._reqs.get(room)
        if holder is not None and holder is not req and self._live(room, holder):
            raise HandoffError(f"request {req.rid} refused: bootstrap room {room} is in use by another live request on"
                               f" this {self._side} server, and SGLang's transports tell transfers apart by room alone",
                               int(HTTPStatus.BAD_REQUEST))
        if holder is not req:
            self._busy.discard(room)
        self._reqs[room] = req
        self._claims += 1
        if self._claims % self.PRUNE_EVERY == 0:
            self._reqs = {r: h for r, h in self._reqs.items() if self._live(r, h)}

    def busy(self, req):
        """``req``'s transfer is under way: its room stays held, finished or not, until :meth:`release`."""
        room = getattr(req, "bootstrap_room", None)
        if room is not None and self._reqs.get(room) is req:
            self._busy.add(room)

    def holds(self, room):
        """Whether a live request holds ``room``."""
        holder = self._reqs.get(room)
        return holder is not None and self._live(room, holder)

    def release(self, req):
        room = getattr(req, "bootstrap_room", None)
        if room is not None and self._reqs.get(room) is req:
            del self._reqs[room]
            self._busy.discard(room)


PREFILL_ROOMS, DECODE_ROOMS = LiveRooms("prefill"), LiveRooms("decode")

# NOTE: markers of the upstream fix for the incident path: a request SGLang already rejected (set to finish
# with an abort, ``to_finish``, and shrunk to a one-token placeholder) is refused before its handoff starts.
# SGLang's KV-capacity check (``_check_if_req_exceed_kv_capacity``) is not one: the placeholder passes it.
_FIX_MARKERS = ("is_aborted(", ".to_finish")
# Where SGLang runs before a handoff starts: the scheduler's queue routing (newer SGLang rejects there), the
# bootstrap queue's sender creation and its add.
_FIX_SITES = (("sglang.srt.managers.scheduler", "Scheduler._add_request_to_queue"),
              ("sglang.srt.disaggregation.prefill", "PrefillBootstrapQueue.create_sender"),
              ("sglang.srt.disaggregation.prefill", "PrefillBootstrapQueue.add"))


def has_handoff_fix():
    """Whether this SGLang refuses a rejected request before its handoff (the upstream fix), by its code."""
    for module, qualname in _FIX_SITES:
        try:
            fn = hooks.lookup(module, qualname)
        except hooks.HookError:
            continue
        fn = getattr(fn, "_kvshield_original", fn)  # NOTE: probe SGLang's code, not our wrapper
        try:
            src = inspect.getsource(fn)
        except (OSError, TypeError):
            continue
        if any(m in src for m in _FIX_MARKERS):
            return True
    return False


def check_handoff_fix(level=None):
    """Warns loudly without the upstream fix; under COMPLIANCE refuses (the hook is then recorded as failed
    and the rank does not serve) unless ``KVSHIELD_ALLOW_UNFIXED_HANDOFF=1``."""
    if has_handoff_fix():
        return True
    msg = ("SGLang refuses no rejected request before its prefill bootstrap (the upstream handoff-isolation fix is "
           "missing): a request rejected for length could enter the prefill→decode handoff. kvshield's hook blocks "
           "it, but upgrade SGLang.")
    logger.warning("kvshield: %s", msg)
    level = settings.level(level or os.environ.get("KVSHIELD_LEVEL", "ZERO"))  # NOTE: as Java reads it, or refused
    if level == "COMPLIANCE" and os.environ.get(ALLOW_UNFIXED) != "1":
        raise UnsupportedFeatureError(f"{msg} COMPLIANCE refuses to start; set {ALLOW_UNFIXED}=1 to override")
    return False


def rejected(req):
    """Whether SGLang already decided ``req`` finishes (an abort set, or a finish reason)."""
    return getattr(req, "to_finish", None) is not None or getattr(req, "finished_reason", None) is not None


def fail_request(req, error):
    """Marks ``req`` to finish with an abort carrying ``error``'s status (SGLang's ``prepare_abort``)."""
    from sglang.srt.disaggregation.utils import prepare_abort

    prepare_abort(req, str(error), status_code=error.status_code)


def _allocator_of(queue):
    sched = getattr(queue, "scheduler", None)
    return getattr(queue, "token_to_kv_pool_allocator", None) or getattr(sched, "token_to_kv_pool_allocator", None)


def _stream(queue, reqs):
    sched = getattr(queue, "scheduler", None)
    streamer = getattr(sched, "output_streamer", sched)  # NOTE: newer SGLang streams through output_streamer
    if streamer is not None and hasattr(streamer, "stream_output"):
        streamer.stream_output(reqs, any(getattr(r, "return_logprob", False) for r in reqs))


def _handoff_of(queue):
    """The decode pool's Handoff (created on first use on a kvshield allocator), or None."""
    alloc = _allocator_of(queue)
    handoff = getattr(alloc, "kvshield_handoff", None)
    if handoff is None and hasattr(alloc, "admission_limits") and hasattr(alloc, "_j"):
        from .handoff import Handoff

        handoff = alloc.kvshield_handoff = Handoff(alloc)
    return handoff


def _hook(owner, name, wrap, *args):
    """Replaces ``owner.name`` with ``wrap(original, *args)`` once."""
    original = getattr(owner, name)
    if getattr(original, "_kvshield_wrap", None) is not wrap:  # NOTE: by this wrapper (others may wrap it too)
        hooked = wrap(original, *args)
        hooked._kvshield, hooked._kvshield_wrap, hooked._kvshield_original = True, wrap, original
        setattr(owner, name, hooked)


def install_prefill_admission():
    """``PrefillBootstrapQueue.create_sender`` (where a handoff starts; an SGLang without it: ``add``): a
    rejected or oversized request never gets a sender."""
    queue = hooks.lookup("sglang.srt.disaggregation.prefill", "PrefillBootstrapQueue")
    name = "create_sender" if hasattr(queue, "create_sender") else "add"
    hooks.expect(hooks.lookup("sglang.srt.disaggregation.prefill", f"PrefillBootstrapQueue.{name}"),
                 f"PrefillBootstrapQueue.{name}", ("self", "req", "num_kv_heads"))
    hooks.expect(hooks.lookup("sglang.srt.disaggregation.utils", "prepare_abort"), "prepare_abort", ("req",))
    _hook(queue, name, _wrap_add, name == "create_sender")


def install_decode():
    """Decode admission, preallocation, transfer, release and ``req_to_token`` frees, all or nothing
    (admission without the reservation would leave requests half-tracked)."""
    settings.seconds(ACK_TIMEOUT, DEFAULT_ACK_TIMEOUT_S)  # NOTE: a bad value refuses the start, not a step
    module = "sglang.srt.disaggregation.decode"
    prealloc = hooks.lookup(module, "DecodePreallocQueue")
    transfer = hooks.lookup(module, "DecodeTransferQueue")
    rows = hooks.lookup(module, "DecodeReqToTokenPool")
    decode = importlib.import_module(module)
    hooks.expect(hooks.lookup(module, "DecodePreallocQueue.add"), "DecodePreallocQueue.add", ("self", "req"))
    hooks.expect(hooks.lookup(module, "DecodePreallocQueue.pop_preallocated"), "DecodePreallocQueue.pop_preallocated", ("self",))
    hooks.expect(hooks.lookup(module, "DecodePreallocQueue._pre_alloc_fill_len"), "DecodePreallocQueue._pre_alloc_fill_len",
                 ("req",))
    hooks.expect(hooks.lookup(module, "alloc_for_decode_prealloc"), f"{module}.alloc_for_decode_prealloc", ("allocator",),
                 ("req", "fill_len", "prefix_len"))
    hooks.expect(hooks.lookup(module, "release_kv_cache"), f"{module}.release_kv_cache", ("req", "tree_cache"))
    hooks.expect(hooks.lookup(module, "DecodeReqToTokenPool.free"), "DecodeReqToTokenPool.free", ("self", "req"))
    hooks.expect(hooks.lookup(module, "DecodeTransferQueue.pop_transferred"), "DecodeTransferQueue.pop_transferred", ("self",))
    hooks.lookup(module, "FINISH_ABORT")
    _hook(prealloc, "add", _wrap_decode_add)
    _hook(prealloc, "pop_preallocated", _wrap_pop_preallocated)
    _hook(decode, "alloc_for_decode_prealloc", _wrap_prealloc_alloc)
    _hook(decode, "release_kv_cache", _wrap_release)
    _hook(rows, "free", _wrap_row_free)
    _hook(transfer, "pop_transferred", _wrap_pop)
    if hasattr(prealloc, "_release_matched_prefix_lock"):  # NOTE: where SGLang releases one request's prefix lock by node
        hooks.expect(hooks.lookup(module, "DecodePreallocQueue._release_matched_prefix_lock"),
                     "DecodePreallocQueue._release_matched_prefix_lock", ("self", "req"))
        _hook(prealloc, "_release_matched_prefix_lock", _wrap_release_prefix_lock)


def _wrap_release_prefix_lock(original):
    def release_matched_prefix_lock(self, req, *args, **kwargs):
        from .prefix_cache import unlocking

        with unlocking(req):
            return original(self, req, *args, **kwargs)

    return release_matched_prefix_lock


def install_transports():
    """SGLang's fake transport counts what each send carried; its ``MetadataBuffers`` carry kvshield's row."""
    fake, utils = "sglang.srt.disaggregation.fake.conn", "sglang.srt.disaggregation.utils"
    conn = importlib.import_module(fake)
    for qualname, params in (("FakeKVSender.__init__", ("self", "mgr", "bootstrap_addr", "bootstrap_room")),
                             ("FakeKVSender.send", ("self", "kv_indices")),
                             ("FakeKVReceiver.__init__", ("self", "mgr", "bootstrap_addr", "bootstrap_room"))):
        hooks.expect(hooks.lookup(fake, qualname), qualname, params)
    buffers = hooks.lookup(utils, "MetadataBuffers")
    hooks.expect(hooks.lookup(utils, "MetadataBuffers.__init__"), "MetadataBuffers.__init__", ("self", "size"))
    hooks.expect(hooks.lookup(utils, "MetadataBuffers.get_buf_infos"), "MetadataBuffers.get_buf_infos", ("self",))
    transport.install_fake(conn)
    transport.install_metadata(buffers)


def _wrap_add(original, returns_created):
    """The bootstrap queue's sender creation (``returns_created``: SGLang's ``create_sender``, which answers
    whether it created one) or ``add``: a request SGLang already rejected, or longer than the pool's effective
    limit, is aborted (400) and streamed instead; the pool's limit is published for the handshake and the
    created sender is armed to write the request's coverage row."""

    def admit(self, req, *args, **kwargs):
        alloc = _allocator_of(self)
        if not hasattr(alloc, "admission_limits"):
            return original(self, req, *args, **kwargs)
        effective = alloc.admission_limits()[0]
        if getattr(req, "bootstrap_host", None) is not None:
            transport.LOOPBACK.publish_limit(f"{req.bootstrap_host}:{req.bootstrap_port}", effective)
        error = None
        if rejected(req):
            error = HandoffError(f"request {req.rid} was rejected before bootstrap; it never starts a handoff",
                                 int(HTTPStatus.BAD_REQUEST))
        elif len(req.origin_input_ids) > effective:
            error = HandoffError(f"request {req.rid} of {len(req.origin_input_ids)} tokens exceeds the effective limit "
                                 f"of {effective} tokens", int(HTTPStatus.BAD_REQUEST))
        elif not _to_fake_host(req):
            try:
                PREFILL_ROOMS.claim(req)
            except HandoffError as e:
                error = e
        if error is not None:
            logger.error("kvshield: %s", error)
            fail_request(req, error)
            _stream(self, [req])
            return False if returns_created else None
        result = original(self, req, *args, **kwargs)
        sender = getattr(req, "disagg_kv_sender", None)
        if sender is not None and (result or not returns_created):
            carried = transport.kv_buffers(getattr(self, "kv_manager", None)) or 0
            transport.arm_sender(sender, req, getattr(self, "metadata_buffers", None), alloc.page_size, effective,
                                 tenant=_tenant_of(req), carried=carried)
        return result

    return admit


# ---------------------------------------------------------------- decode admission and prealloc

class _InFlight:
    """A reservation whose transport has not acknowledged yet."""

    __slots__ = ("receiver", "adapter", "given_up_at", "expired", "forgotten", "drained")

    def __init__(self, receiver, adapter):
        self.receiver, self.adapter, self.given_up_at, self.expired = receiver, adapter, None, False
        self.forgotten = False  # the decode side is done with the request; its room waits for the transfer
        self.drained = False  # every prefill rank acknowledged the abort's drain when the decode side gave up (_drained)


def _admit(queue, handoff, req, receiver):
    """Raises HandoffError unless ``req`` can be reserved: readable transport, tenant, limit, handshake."""
    adapter = transport.adapter_for(receiver)
    if adapter is None:
        raise HandoffError(transport.unsupported_message(receiver, req.rid), int(HTTPStatus.INTERNAL_SERVER_ERROR))
    if getattr(getattr(queue.scheduler, "server_args", None), "disaggregation_decode_enable_radix_cache", False):
        raise HandoffError(f"request {req.rid} refused: the decode radix cache sends prefill only a delta, and a "
                           "kvshield reservation covers the whole input; disable it", int(HTTPStatus.INTERNAL_SERVER_ERROR))
    if getattr(req, "kvshield_tenant", None) is None:
        raise HandoffError(f"request {req.rid} carries no kvshield tenant (the scheduler-side engine hook stamps it)",
                           int(HTTPStatus.INTERNAL_SERVER_ERROR))
    n, limit = _fill_len(req), handoff.effective_limit()
    if n > limit:
        raise HandoffError(f"request {req.rid} of {n} tokens to preallocate (its input, and output so far when "
                           f"rebootstrapped) exceeds the effective limit of {limit} tokens", int(HTTPStatus.BAD_REQUEST))
    _check_decode_quota(queue, handoff.allocator, req)
    if _declares_no_transfer(req, receiver):
        transport.clear_rows_at_send(receiver, req, getattr(queue, "metadata_buffers", None))
        handoff.admit_no_transfer(req, req.kvshield_tenant)
        logger.info("kvshield: request %s declares no KV transfer (SGLang's fake bootstrap host): it decodes over its "
                    "own freshly handed-out pages, never committed as a handoff", req.rid)
        return
    if getattr(adapter, "limit_with_transfer", False):
        adapter.bind(receiver, req, getattr(queue, "metadata_buffers", None),
                     getattr(queue, "req_to_metadata_buffer_idx_allocator", None))
    peer, peer_limit = adapter.peer(receiver)
    if peer_limit is None and getattr(adapter, "limit_with_transfer", False):
        # NOTE: the prefill's limit arrives in the coverage row; until then the peer is recorded with ours, and
        # the commit compares the row's (a mismatch refuses before anything is decoded).
        peer_limit = limit
    if peer_limit is None:
        raise HandoffError(f"request {req.rid} refused: its prefill peer published no request limit over transport "
                           f"{adapter.name}, so the limits were never compared", int(HTTPStatus.SERVICE_UNAVAILABLE))
    handoff.ensure_peer(peer, peer_limit)
    DECODE_ROOMS.claim(req)
    DECODE_ROOMS.busy(req)  # NOTE: held until its transfer is acknowledged or expired (_forget, sweep), finished or not
    handoff.peer_of[req] = peer


def _fill_len(req):
    """The tokens SGLang preallocates for ``req`` on the decode side, which its prefill then sends: its input, and for a
    PD rebootstrap its output so far too (the recompute's input). SGLang's own rule
    (``DecodePreallocQueue._pre_alloc_fill_len``, checked at install), so the effective-limit check, the reservation and
    the commit's coverage (the reservation's length) are exactly what SGLang allocates."""
    from sglang.srt.disaggregation.decode import DecodePreallocQueue

    return int(DecodePreallocQueue._pre_alloc_fill_len(req))


def _live_decode_reqs(queue):
    """Every request a decode server keeps alive (SGLang's ``disaggregation/decode.py``), each once: the running
    batch, the scheduler's waiting queue (KV arrived or a retracted one resumed, not yet running), the prealloc
    queue (its pending ones too), the retracted queue and the retracted ones held for rebootstrap (both come back
    through ``_pre_alloc``/``add`` with their whole worst case), the transfer queue."""
    sched = getattr(queue, "scheduler", None)
    transfer = getattr(queue, "transfer_queue", None)
    groups = (getattr(getattr(sched, "running_batch", None), "reqs", None), getattr(sched, "waiting_queue", None),
              [d.req for d in getattr(queue, "queue", None) or []],
              [d.req for d in getattr(queue, "pending_reqs", None) or []],
              getattr(queue, "retracted_queue", None), getattr(queue, "held_rebootstrap_reqs", None),
              [d.req for d in getattr(transfer, "queue", None) or []])
    return list({id(r): r for group in groups for r in group or []}.values())


def _check_decode_quota(queue, allocator, req):
    """Raises HandoffError unless ``req``'s tenant quota holds its worst case beside the worst case of the
    tenant's requests this decode server already keeps alive (:func:`_live_decode_reqs`): a quota is a
    per-request outcome, never a decode step whose allocation fails for the whole batch. Whole quota too
    small: 400; too little left now: 503 (the client retries)."""
    tenant = req.kvshield_tenant
    quota = allocator.tenant_quota_pages(tenant)
    if quota is None:
        return
    ps = allocator.page_size
    need = request_pages(req, ps)
    if need > quota:
        raise HandoffError(f"request {req.rid} needs up to {need} KV pages; tenant {tenant}'s quota is {quota} pages",
                           int(HTTPStatus.BAD_REQUEST))
    # NOTE: what the tenant owns now covers each live request's pages so far; each may still grow to its worst case
    # (a queued or retracted one, holding nothing, to its whole worst case; a finished one not at all)
    growth = sum(worst_case_pages(r, ps) for r in _live_decode_reqs(queue)
                 if r is not req and getattr(r, "kvshield_tenant", None) == tenant)
    left = quota - allocator.tenant_owned_pages(tenant) - growth
    if need > left:
        raise HandoffError(f"request {req.rid} needs up to {need} KV pages; tenant {tenant}'s quota has {left} of "
                           f"{quota} left on this decode server", int(HTTPStatus.SERVICE_UNAVAILABLE))


def _declares_no_transfer(req, receiver):
    """Whether ``req`` is one of SGLang's no-transfer requests (warmup, health check, or a client naming
    the fake bootstrap host): SGLang gave it the fake receiver, so no KV will arrive."""
    return _to_fake_host(req) and any(transport.qualname(c) == transport.FAKE_RECEIVER for c in type(receiver).__mro__)


def _to_fake_host(req):
    utils = sys.modules.get("sglang.srt.disaggregation.utils")
    fake_host = getattr(utils, "FAKE_BOOTSTRAP_HOST", None)
    return fake_host is not None and getattr(req, "bootstrap_host", None) == fake_host


def _wrap_decode_add(original):
    def add(self, req, *args, **kwargs):
        original(self, req, *args, **kwargs)
        handoff = _handoff_of(self)
        entry = next((d for d in reversed(self.queue) if d.req is req), None)
        if handoff is None or entry is None:
            return
        try:
            _admit(self, handoff, req, entry.kv_receiver)
        except HandoffError as e:
            logger.error("kvshield: %s", e)
            fail_request(req, e)  # pop_preallocated drops it, streams the abort, clears the receiver

    return add


class _Refused(Exception):
    """A reservation SGLang's budget allowed but kvshield could not make (raised through SGLang's
    ``_pre_alloc`` to the hooked ``pop_preallocated``, never to the scheduler)."""

    def __init__(self, req, error):
        super().__init__(str(error))
        self.req, self.error = req, error


class _Pass:
    """One run of SGLang's ``pop_preallocated`` under the hook: the requests SGLang preallocated in it, in order,
    whether kvshield reserved for them or not (a no-transfer request's ordinary allocation)."""

    __slots__ = ("handoff", "preallocated")

    def __init__(self, handoff):
        self.handoff, self.preallocated = handoff, []


def _salvage(queue, step, refused, args, kwargs):
    """SGLang's ``pop_preallocated`` stopped at ``refused``: takes out of the queue what that run already
    did (every request it preallocated before it, each of whose receivers was told its pages and metadata
    index; aborts it streamed), undoes the refused request's ``_pre_alloc`` (its ``req_to_token`` row;
    nothing was reserved) and aborts it (503), so the next run streams it as failed. Returns
    (preallocated, failed) of the interrupted run."""
    aborted = getattr(sys.modules.get(type(queue).__module__), "FINISH_ABORT", ())
    rids = kwargs.get("rids_to_check", args[0] if args else None)
    req = refused.req
    done = [d for d in queue.queue if any(d.req is r for r in step.preallocated)]
    failed = [d for d in queue.queue if d.req is not req and isinstance(d.req.finished_reason, aborted)
              and (rids is None or d.req.rid in rids)]
    gone = {id(d) for d in done + failed}
    queue.queue = [d for d in queue.queue if id(d) not in gone]
    if getattr(req, "req_pool_idx", None) is not None:
        queue.req_to_token_pool.free(req)
    for attr in ("kv_committed_len", "kv_allocated_len"):
        if hasattr(req, attr):
            setattr(req, attr, 0)
    logger.error("kvshield: %s", refused.error)
    fail_request(req, refused.error)
    return done, failed


def _wrap_pop_preallocated(original):
    def pop_preallocated(self, *args, **kwargs):
        handoff = _handoff_of(self)
        if handoff is None:
            return original(self, *args, **kwargs)
        sweep(handoff, getattr(self, "gloo_group", None))
        preallocated, failed = [], []
        while True:  # NOTE: each refusal aborts one queued request, so this ends within the queue's length
            step = _Pass(handoff)
            token = _RESERVING.set(step)
            try:
                done, dropped = original(self, *args, **kwargs)
                refused = None
            except _Refused as e:
                done, dropped = _salvage(self, step, e, args, kwargs)
                refused = e
            finally:
                _RESERVING.reset(token)
            preallocated += done
            failed += dropped
            if refused is None:
                break
        for d in preallocated:
            if handoff.has_reservation(d.req):
                handoff.inflight[d.req] = _InFlight(d.kv_receiver, transport.adapter_for(d.kv_receiver))
        for d in failed:
            handoff.peer_of.pop(d.req, None)
            handoff.no_transfer.pop(d.req, None)
            _forget(d.req, handoff)
        return preallocated, failed

    return pop_preallocated


class _Reserved:
    """The allocator as ``alloc_for_decode_prealloc`` sees it inside a hooked prealloc: the allocation
    returns the reservation's slots (exactly the pages the receiver is then told to fill)."""

    def __init__(self, allocator, slots):
        self._allocator, self._slots = allocator, slots

    def __getattr__(self, name):
        return getattr(self._allocator, name)

    def _take(self, n):
        if int(n) != len(self._slots):
            raise HandoffError(f"decode prealloc asked for {int(n)} slots; the reservation holds {len(self._slots)}",
                               int(HTTPStatus.INTERNAL_SERVER_ERROR))
        device = self._allocator.device
        return self._slots if device in ("cpu", None) else self._slots.to(device, non_blocking=True)

    def alloc(self, need_size):
        return self._take(need_size)

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens, *a, **k):
        return self._take(extend_num_tokens)


def _planned_prealloc(original, allocator, args, req, tenant, kwargs):
    """SGLang's own ``alloc_for_decode_prealloc``, planned for ``req`` (its ``Req`` object, as the plug-in's
    planning names it) of ``tenant``: the pages are the request's holds, released by its own release."""
    prefix = kwargs.get("total_prefix_len", kwargs.get("prefix_len")) or 0
    allocator.set_plan([(req, tenant, int(prefix), int(kwargs["fill_len"]))])
    try:
        return original(allocator, *args, req=req, **kwargs)
    finally:
        allocator.clear_plan()


def _tenant_of(req):
    """``req``'s tenant as the plug-in's planning resolves it (server-side data only)."""
    global _RESOLVER
    if _RESOLVER is None:
        from .tenants import TenantResolver

        _RESOLVER = TenantResolver.from_env()
    return _RESOLVER.resolve_request(req)


_RESOLVER = None


def _wrap_prealloc_alloc(original):
    def alloc_for_decode_prealloc(allocator, *args, req, **kwargs):
        step = _RESERVING.get()
        kv_loc = _prealloc(original, None if step is None else step.handoff, allocator, args, req, kwargs)
        if step is not None:
            # NOTE: SGLang sends this request's metadata next, with no exit between: preallocated in this pass, whatever
            # kvshield did for it (a refusal later in the pass must not leave it queued to be preallocated again)
            step.preallocated.append(req)
        return kv_loc

    return alloc_for_decode_prealloc


def _prealloc(original, handoff, allocator, args, req, kwargs):
    """``req``'s ``alloc_for_decode_prealloc`` (``handoff``: the pool's, inside a hooked ``pop_preallocated``)."""
    if handoff is None or (req not in handoff.peer_of and req not in handoff.no_transfer
                           and getattr(req, "retraction_count", 0) > 0):
        # NOTE: SGLang's _pre_alloc outside a handoff's preallocation: a retracted request resumed
        # (resume_retracted_reqs), whose KV comes back from its host copy. Its handoff ended with its first
        # life (finished at its retraction's row free): no second reservation, an ordinary allocation of the
        # request's own pages (planned, so its release presents them; unplanned they would be the default
        # tenant's unattributed pages, and every free of its release refused).
        if not hasattr(allocator, "set_plan"):
            return original(allocator, *args, req=req, **kwargs)
        return _planned_prealloc(original, allocator, args, req, _tenant_of(req), kwargs)
    tenant = handoff.no_transfer.get(req)
    if tenant is not None:  # NOTE: an ordinary allocation: fresh pages of this request, nothing reserved
        return _planned_prealloc(original, allocator, args, req, tenant, kwargs)
    if kwargs.get("prefix_len"):
        raise UnsupportedFeatureError(f"request {req.rid}: decode prefix reuse with kvshield handoffs")
    peer = handoff.peer_of.pop(req, None)
    if peer is None:
        raise HandoffError(f"request {req.rid} reached decode prealloc without kvshield's admission "
                           "(DecodePreallocQueue.add hook)", int(HTTPStatus.INTERNAL_SERVER_ERROR))
    n = _fill_len(req)
    try:
        slots = handoff.reserve(req, req.kvshield_tenant, n, peer)
    except HandoffError as e:
        raise _Refused(req, e) from None
    if slots is None:
        raise _Refused(req, HandoffError(
            f"request {req.rid} refused: no room to reserve {n} tokens on the decode pool "
            f"({handoff.last_shortfall()}); nothing was reserved", int(HTTPStatus.SERVICE_UNAVAILABLE)))
    try:
        kv_loc = original(_Reserved(allocator, slots), *args, req=req, **kwargs)
    except HandoffError as e:  # NOTE: no page id reached the receiver yet, so nothing can be in flight
        handoff.abort(req)
        handoff.acknowledge(req)
        raise _Refused(req, e) from None
    _OWNER[req] = handoff
    return kv_loc


# ---------------------------------------------------------------- decode transfer, release, acknowledgement

def _give_up(handoff, req):
    """The decode side stops waiting for ``req``'s transfer: abort (pages quarantined while the claims
    live) and start the acknowledgement deadline."""
    if handoff.has_reservation(req) and handoff.outcome(req) != "COMMITTED":
        handoff.abort(req)
    entry = handoff.inflight.get(req)
    if entry is not None and entry.given_up_at is None:
        entry.given_up_at = time.monotonic()
        entry.drained = _drained(entry.receiver, getattr(req, "bootstrap_room", None))


def _drained(receiver, room):
    """Whether SGLang's deferred decode KV release (``SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE``) holds its
    evidence that nothing more will be written for ``room``: the drain acknowledgement of every prefill rank told of
    the abort (``is_abort_release_safe``, with the count SGLang requires: one per ``bootstrap_infos`` entry). Read when
    the decode side gives up, inside SGLang's release of the request: SGLang clears the acknowledgements right after
    it. A transfer that timed out of that hold has none, so it still expires."""
    manager = getattr(receiver, "kv_mgr", None)
    infos = getattr(receiver, "bootstrap_infos", None)
    safe = getattr(manager, "is_abort_release_safe", None)
    if room is None or not infos or not callable(safe) or not getattr(manager, "enable_deferred_decode_kv_release", False):
        return False
    return bool(safe(room, len(infos)))  # NOTE: at least one acknowledgement: an unarmed room counts none


def sweep(handoff, group=None, now=None):
    """Acknowledges reservations whose transport says, on every rank of ``group`` (the queue's gloo
    group), that nothing more will be written; expires those given up on and unacknowledged past
    ``KVSHIELD_HANDOFF_ACK_TIMEOUT_S`` on some rank's clock (alarm, pages held back)."""
    now = time.monotonic() if now is None else now
    timeout = settings.seconds(ACK_TIMEOUT, DEFAULT_ACK_TIMEOUT_S)
    entries = list(handoff.inflight.items())
    acked = consensus.every_rank([e.drained or (e.adapter is not None and e.adapter.acknowledged(e.receiver))
                                  for _, e in entries], group)
    overdue = consensus.any_rank([e.given_up_at is not None and now - e.given_up_at >= timeout for _, e in entries],
                                 group)
    for (req, e), ack, late in zip(entries, acked, overdue):
        if ack:
            handoff.acknowledge(req)
            del handoff.inflight[req]
            release = getattr(e.adapter, "release", None)
            if release is not None:
                release(e.receiver)  # its metadata index goes back to SGLang
            if not handoff.has_reservation(req):
                _OWNER.pop(req, None)
            if e.forgotten:
                _free_room(req)
        elif late and not e.expired:
            handoff.expire(req)
            e.expired = True
            if e.forgotten:
                _free_room(req)  # NOTE: claims fenced, pages and metadata index held back for good
            logger.error("kvshield: handoff of request %s expired unacknowledged; its pages stay quarantined",
                         getattr(req, "rid", req))


def _coverage(handoff, req, receiver):
    adapter = transport.adapter_for(receiver)
    if adapter is None:
        raise HandoffError(transport.unsupported_message(receiver, req.rid), int(HTTPStatus.INTERNAL_SERVER_ERROR))
    reserved = handoff.reserved_tokens(req)  # NOTE: what SGLang preallocated, so what its prefill sends (_fill_len)
    if getattr(adapter, "limit_with_transfer", False):
        covered, peer_limit, sender_tenant, carried = adapter.row(receiver, req.rid)
        _same_tenant(adapter, req, covered, reserved, sender_tenant)
        if sender_tenant == transport.tenant_tag(_tenant_of(req)):
            adapter.accept(receiver)  # NOTE: this transfer's own row: its Success is the acknowledgement
        _carries_every_buffer(handoff, req, receiver, carried)
        handoff.ensure_peer(adapter.peer(receiver)[0], peer_limit)
        # NOTE: the transport wrote the pages itself; its Success plus the row are the evidence, for these slots only.
        handoff.record_covered(req, covered)
        return covered
    covered = adapter.covered_tokens(receiver)
    if covered is None:
        raise HandoffError(f"handoff refused: transport {adapter.name} published no coverage for request {req.rid}",
                           int(HTTPStatus.INTERNAL_SERVER_ERROR))
    sender_tenant = getattr(adapter, "sender_tenant", None)
    _same_tenant(adapter, req, covered, reserved, None if sender_tenant is None else sender_tenant(receiver))
    return covered


def _carries_every_buffer(handoff, req, receiver, carried):
    """Refuses (500) under ``NONE`` a transfer whose prefill carried fewer KV buffers than this decode server's transfers
    hold (or cannot say how many): a decode draft model (EAGLE) whose prefill runs none, whose buffers SGLang's
    transports never write. The coverage is recorded for every buffer of its slots, and unscrubbed pages keep an
    earlier request's KV in the buffers never written, which the draft model reads (design note 55). Scrubbing levels
    hand reserved pages out zeroed."""
    own = transport.kv_buffers(getattr(receiver, "kv_mgr", None))
    if (own is not None and carried >= own) or handoff.level_of(_tenant_of(req)) != "NONE":
        return
    raise HandoffError(f"handoff refused: request {req.rid}'s prefill carried {carried} KV buffers, this decode server's "
                       f"transfers hold {'an unknown number' if own is None else own}: the rest are never written and, at "
                       "protection level NONE, keep an earlier request's KV", int(HTTPStatus.INTERNAL_SERVER_ERROR))


def _same_tenant(adapter, req, covered, reserved, sender_tag):
    """Refuses (500) a transfer that could commit (it covers the ``reserved`` tokens) when the prefill side sent it
    for another tenant than ``req``'s, or for no tenant the transport can name: a colliding or reused bootstrap
    room must not commit one tenant's KV into another's request. A transfer short of the reservation is left
    to the commit, which refuses it naming its coverage."""
    if covered < reserved:
        return
    if sender_tag is None:
        raise HandoffError(f"handoff refused: transport {adapter.name} does not say whose request request {req.rid}'s"
                           " transfer was sent for", int(HTTPStatus.INTERNAL_SERVER_ERROR))
    if sender_tag != transport.tenant_tag(_tenant_of(req)):
        raise HandoffError(f"handoff refused: request {req.rid} received a transfer sent for another tenant (bootstrap"
                           f" room {getattr(req, 'bootstrap_room', None)} collides or was reused)",
                           int(HTTPStatus.INTERNAL_SERVER_ERROR))


def _wrap_pop(original):
    def pop_transferred(self, *args, **kwargs):
        handoff = _handoff_of(self)
        if handoff is None:
            return original(self, *args, **kwargs)
        sweep(handoff, getattr(self, "gloo_group", None))
        receivers = {id(d.req): d.kv_receiver for d in self.queue}
        done = original(self, *args, **kwargs)
        ok, failed = [], []
        for req in done:
            if handoff.serve_no_transfer(req):
                ok.append(req)
                continue
            try:
                handoff.commit(req, _coverage(handoff, req, receivers.get(id(req))))
                ok.append(req)
            except HandoffError as e:
                logger.error("kvshield: %s", e)
                fail_request(req, e)
                failed.append(req)
            _forget(req, handoff)  # NOTE: coverage is read once, at commit
        if failed:
            _stream(self, failed)
            tree_cache = getattr(self, "tree_cache", None)
            release = _release_of(self)
            for req in failed:
                if tree_cache is not None and release is not None:  # as SGLang does for a failed transfer
                    release(req, tree_cache, is_insert=False)  # the hooked release (the refusal released the pages)
                _give_up(handoff, req)
        sweep(handoff, getattr(self, "gloo_group", None))
        return ok

    return pop_transferred


def _forget(req, handoff=None):
    """The decode side is done with ``req`` (committed, refused, given up on). Its room is free once its transfer is
    acknowledged or expired (the moment its claims drop or are fenced, :func:`sweep`): until then the transfer may
    still complete, and SGLang's transports key status by room alone, so its late ``Success`` would reach the next
    request on the room."""
    handoff = handoff if handoff is not None else _OWNER.get(req)
    entry = None if handoff is None else handoff.inflight.get(req)
    if entry is not None and not entry.expired:
        entry.forgotten = True
        return
    _free_room(req)


def _free_room(req):
    """``req``'s room is free, and its transport drops the room's state unless another live request holds the room
    (``req`` was refused beside it)."""
    room = getattr(req, "bootstrap_room", None)
    DECODE_ROOMS.release(req)
    if not DECODE_ROOMS.holds(room):
        transport.forget(room)


def _release_of(queue):
    return getattr(sys.modules.get(type(queue).__module__), "release_kv_cache", None)


def _wrap_release(original):
    def release_kv_cache(req, tree_cache, *args, **kwargs):
        own = getattr(getattr(tree_cache, "token_to_kv_pool_allocator", None), "kvshield_handoff", None)
        if own is not None:
            own.no_transfer.pop(req, None)  # a no-transfer request that failed before it decoded
        handoff = _OWNER.get(req)
        if handoff is None or not handoff.has_reservation(req):
            return original(req, tree_cache, *args, **kwargs)
        outcome = handoff.outcome(req)
        if outcome == "COMMITTED":
            return original(req, tree_cache, *args, **kwargs)
        try:
            if outcome == "PENDING":
                # NOTE: SGLang's release first: its frees present the request's reservation holds (pages under a
                # live transfer stay quarantined by its claims); the abort then releases what SGLang left.
                return original(req, tree_cache, *args, **kwargs)
            # NOTE: the reservation already ended (refused at commit, aborted, expired): the receiver released its
            # pages then and the request holds none of them, so each of SGLang's frees would be a refused double
            # free. SGLang's release runs (row, state) without them; whatever the request still holds is released
            # after it (the plug-in's leftovers).
            return _release_without_frees(original, req, tree_cache, args, kwargs)
        finally:
            _give_up(handoff, req)
            _forget(req, handoff)

    return release_kv_cache


class _NoFrees:
    """The allocator as SGLang's release of a request whose reservation already ended sees it: its ``free`` and
    ``free_segment`` name pages the receiver released already, and do nothing; everything else is the allocator."""

    def __init__(self, allocator):
        self._allocator = allocator

    def __getattr__(self, name):
        return getattr(self._allocator, name)

    def free(self, free_index):
        return None

    def free_segment(self, free_index, *args, **kwargs):
        return None


def _release_without_frees(original, req, tree_cache, args, kwargs):
    """``original(req, tree_cache, ...)`` with the tree cache's allocator frees dropped (scheduler thread: the
    swap is seen by this release only)."""
    alloc = tree_cache.token_to_kv_pool_allocator
    tree_cache.token_to_kv_pool_allocator = _NoFrees(alloc)
    try:
        return original(req, tree_cache, *args, **kwargs)
    finally:
        tree_cache.token_to_kv_pool_allocator = alloc


def _wrap_row_free(original):
    def free(self, req):
        original(self, req)
        handoff = _OWNER.get(req)
        if handoff is None:
            return
        if handoff.has_reservation(req) and handoff.outcome(req) == "COMMITTED":
            handoff.finish(req)  # NOTE: releases only the holds SGLang's release left (none, normally)
            # NOTE: finished once: a retracted request keeps its Req; resumed, its pages are an ordinary allocation
            # of its own, and its later release and row free are ordinary too (no second finish of this record,
            # which would drop from its page list pages it holds again). The acknowledgement still comes by
            # handoff.inflight (sweep).
            _OWNER.pop(req, None)
        elif not handoff.has_reservation(req):
            _OWNER.pop(req, None)

    return free
