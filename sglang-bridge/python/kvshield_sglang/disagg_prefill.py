"""The prefill side of SGLang's disaggregation: a request's source pages stay claimed until the transfer
that reads them has concluded. Hooks ``SchedulerDisaggregationPrefillMixin`` (``sglang.srt.disaggregation.prefill``),
probed by feature.

- ``send_kv_chunk``: on a request's first chunk its send is begun (admission; peer = its bootstrap
  address) and its KV sender's ``send`` is wrapped (:func:`_claim_before_send`), outermost: reader
  claims on exactly the page ids SGLang hands the sender (host ids SGLang itself copied from the
  request's row; nothing more is read on the host), then what the sender's ``send`` was (the coverage
  row of :func:`kvshield_sglang.transport.arm_sender`, armed at bootstrap), then the transport. A page
  may be the request's own, another same-tenant request's (a stock radix-cache hit), the ``kvshield``
  prefix cache's, or the declared shared namespace's (not for a regulated tenant). A chunk kvshield
  cannot claim (no tenant, a page not allocated or of another tenant, too few claim slots) reaches
  neither the coverage row nor the transport; the request is aborted with its error.
- ``process_disagg_prefill_inflight_queue``: a request whose sender reports Success or Failed (the
  transport's evidence that it reads no more) has its claims dropped after SGLang's own handling, and its
  bootstrap room is free for another request (:data:`kvshield_sglang.disagg.PREFILL_ROOMS`). SGLang
  may release the request's KV before that (an abort mid-transfer), and the prefix cache may evict the
  prefix it hit: the pages stay claimed, so quarantined (not scrubbed, not handed out), until the claims
  drop. Every send begun is polled, however SGLang holds its request (in the inflight queue, still
  chunk-prefilled, or let go: a client abort mid-chunked-prefill never reaches the inflight queue).
  A send whose sender does not conclude within ``KVSHIELD_PREFILL_SEND_TIMEOUT_S`` seconds of the last
  chunk handed to its transport (any chunk, the last one or not) is expired: claims fenced, alarm, its
  pages out of circulation (never freed) until the sender concludes after all; its request is failed
  (500) and released if SGLang still queues it, failed if SGLang is still prefilling it, and left as it
  is if SGLang already let go of it.
"""

import logging
import sys
import time
from http import HTTPStatus

from . import consensus, hooks, settings
from .disagg import PREFILL_ROOMS, fail_request
from .errors import HandoffError, from_java, handoff_error

logger = logging.getLogger(__name__)
SEND_TIMEOUT = "KVSHIELD_PREFILL_SEND_TIMEOUT_S"
DEFAULT_SEND_TIMEOUT_S = 60.0
_NO_CLAIM_SLOTS = "dev.kvshield.lease.LeaseCapacityException"  # too few claim slots free: back-pressure (503)


class _Send:
    """A request's send as the hooks track it: the request, when a chunk was last handed over (claimed; None:
    nothing yet, so nothing to fence and no deadline), and whether it expired."""

    __slots__ = ("req", "last_sent_at", "expired")

    def __init__(self, req):
        self.req, self.last_sent_at, self.expired = req, None, False


class PrefillSends:
    """Reader claims of one allocator's outgoing sends (Java ``dev.kvshield.bridge.handoff.PrefillSends``);
    scheduler thread only. Every failure raises :class:`~kvshield_sglang.errors.HandoffError` with the
    HTTP status the client sees."""

    def __init__(self, allocator):
        import jpype

        self._jpype = jpype
        self.allocator = allocator
        self._j = jpype.JClass("dev.kvshield.bridge.handoff.PrefillSends")(allocator._j)
        self._pages = jpype.JArray(jpype.JInt)(int(allocator._j.pageCount()))
        self._peers = {}
        self.sends = {}  # Req -> _Send (a request is its Req object: see the allocator's request_id)
        self.refused = set()  # requests aborted by a refused claim, not yet taken out of SGLang's queues

    def _call(self, fn, *args):
        # NOTE: after the deferred frees, so a claim never lands on a page a pending free already gave
        # up, and a drop never precedes the release it should follow.
        self.allocator.resolve_frees()
        try:
            return fn(*args)
        except self._jpype.JException as e:
            err = from_java(e)
            raise handoff_error(err, HTTPStatus.SERVICE_UNAVAILABLE if err.java_class == _NO_CLAIM_SLOTS
                                else HTTPStatus.INTERNAL_SERVER_ERROR) from None

    def _rid(self, req):
        return self.allocator.request_id(req)

    def peer_id(self, bootstrap_addr):
        """A dense id for a decode peer's bootstrap address (the claims' audit peer)."""
        return self._peers.setdefault(str(bootstrap_addr), len(self._peers) + 1)

    def begin(self, rid, tenant, seq_len, bootstrap_addr):
        """Starts ``rid``'s send; an oversized request raises (400) with nothing recorded."""
        self._call(self._j.begin, self._rid(rid), self.allocator.tenant_id(tenant), int(seq_len),
                   self.peer_id(bootstrap_addr))

    def claim(self, rid, page_indices):
        """Reader claims on the pages ``page_indices`` (host page ids, as SGLang hands its KV sender) not yet
        claimed by ``rid``'s send, all or nothing; returns pages newly claimed."""
        n = len(page_indices)
        if n > len(self._pages):
            raise HandoffError(f"request {getattr(rid, 'rid', rid)} sends {n} pages; the pool has {len(self._pages)}",
                               int(HTTPStatus.INTERNAL_SERVER_ERROR))
        self._pages[0:n] = page_indices
        return int(self._call(self._j.claim, self._rid(rid), self._pages, n))

    def mark_sent(self, rid, tokens):
        self._call(self._j.markSent, self._rid(rid), int(tokens))

    def sent_tokens(self, rid):
        return int(self._call(self._j.sentTokens, self._rid(rid)))

    def claimed_pages(self, rid):
        return int(self._call(self._j.claimedPages, self._rid(rid)))

    def complete(self, rid):
        """The transport reads no more: the claims drop (released pages are then scrubbed and reused), and the
        request's bootstrap room is free for another request."""
        self._call(self._j.complete, self._rid(rid))
        self.sends.pop(rid, None)
        PREFILL_ROOMS.release(rid)

    def expire(self, rid):
        """Claims fenced, alarm, pages kept out of circulation until :meth:`complete`."""
        self._call(self._j.expire, self._rid(rid))

    def has_send(self, rid):
        return bool(self._j.has(self._rid(rid)))

    def active(self):
        return int(self._j.active())

    def alarms(self):
        return [str(a) for a in self._j.alarms()]


def sends_of(scheduler):
    """The prefill pool's :class:`PrefillSends` (created on first use on a kvshield allocator), or None."""
    alloc = getattr(scheduler, "token_to_kv_pool_allocator", None)
    sends = getattr(alloc, "kvshield_prefill_sends", None)
    if sends is None and hasattr(alloc, "admission_limits") and hasattr(alloc, "_j"):
        sends = alloc.kvshield_prefill_sends = PrefillSends(alloc)
    return sends


def _begin(sends, req):
    """Begins ``req``'s send on its first chunk and puts the claims in front of its sender; HandoffError refuses it."""
    if req in sends.sends:
        return sends.sends[req]
    tenant = getattr(req, "kvshield_tenant", None)
    if tenant is None:
        raise HandoffError(f"request {req.rid} carries no kvshield tenant (the scheduler-side engine hook stamps it); "
                           "its KV is not sent", int(HTTPStatus.INTERNAL_SERVER_ERROR))
    sends.begin(req, tenant, len(req.origin_input_ids), f"{req.bootstrap_host}:{req.bootstrap_port}")
    PREFILL_ROOMS.busy(req)  # NOTE: its room stays held until the sender concludes, finished or not
    send = sends.sends[req] = _Send(req)
    _claim_before_send(sends, req)
    return send


def _claim_before_send(sends, req):
    """Wraps ``req``'s KV sender's ``send``: the chunk's pages claimed first (a refusal aborts the request and
    hands nothing on), then the ``send`` it wraps (the coverage row, then the transport)."""
    sender = req.disagg_kv_sender
    inner = sender.send

    def send_claimed(page_indices, *args, **kwargs):
        send = sends.sends.get(req)
        if send is None or req in sends.refused:
            logger.error("kvshield: request %s: a chunk sent after its send was refused or concluded is dropped", req.rid)
            return None
        try:
            sends.claim(req, page_indices)
        except HandoffError as e:
            _refuse(sends, req, e)
            return None
        # NOTE: every chunk, not only the last: the deadline runs from the latest one handed over
        send.last_sent_at = time.monotonic()
        return inner(page_indices, *args, **kwargs)

    sender.send = send_claimed


def _refuse(sends, req, error):
    """Nothing of this chunk reaches the transport; the request is aborted with ``error``. Chunks handed
    over before stay claimed until the sender, aborted now, concludes."""
    logger.error("kvshield: %s", error)
    fail_request(req, error)
    sends.refused.add(req)
    send = sends.sends.get(req)
    # NOTE: judged by what send_claimed handed over, not by the coverage marked once the whole chunk returned: a
    # chunk SGLang sends in segments (staging) may have handed some over before this one was refused
    if send is not None and send.last_sent_at is None:
        sends.complete(req)  # NOTE: nothing was handed over, so nothing can be read
    elif send is not None:
        send.last_sent_at = time.monotonic()
        if hasattr(req.disagg_kv_sender, "abort"):
            req.disagg_kv_sender.abort()


def _wrap_send_kv_chunk(original):
    def send_kv_chunk(self, req, last_chunk=False, end_idx=None):
        sends = sends_of(self)
        if sends is None:
            return original(self, req, last_chunk, end_idx)
        if req in sends.refused:
            return None
        try:
            _begin(sends, req)
        except HandoffError as e:
            _refuse(sends, req, e)
            return None
        sent_before = req.start_send_idx
        result = original(self, req, last_chunk, end_idx)
        # NOTE: SGLang advances start_send_idx to the chunk's end once the transport has every segment
        if req not in sends.refused and req.start_send_idx > sent_before:
            sends.mark_sent(req, req.start_send_idx)
        return result

    return send_kv_chunk


def _finish_failed(scheduler, reqs, error_of):
    """Takes ``reqs`` out of the inflight queue the way SGLang's Failed branch does: release the KV, abort
    (``error_of(req)``, None: already set), stream, give back the metadata buffer."""
    prefill = sys.modules["sglang.srt.disaggregation.prefill"]
    gone = {id(r) for r in reqs}
    scheduler.disagg_prefill_inflight_queue = [r for r in scheduler.disagg_prefill_inflight_queue if id(r) not in gone]
    for req in reqs:
        prefill.release_kv_cache(req, scheduler.tree_cache)
        error = error_of(req)
        if error is not None:
            fail_request(req, error)
    if reqs:
        scheduler.output_streamer.stream_output(reqs, any(getattr(r, "return_logprob", False) for r in reqs))
    for req in reqs:
        prefill.maybe_release_metadata_buffer(req, scheduler.req_to_metadata_buffer_idx_allocator)


def _tracked(scheduler, sends):
    """The sends :func:`sweep` polls: every send begun, however SGLang holds its request (in its inflight queue,
    still chunk-prefilled, or let go of: a client abort mid-chunked-prefill drops the request without it ever
    reaching the inflight queue). In begin order, the same on every rank."""
    del scheduler
    return list(sends.sends.values())


def _overdue(send, now, timeout):
    """Past the deadline: ``timeout`` seconds since the last chunk handed to the transport (None: nothing was)."""
    return send.last_sent_at is not None and now - send.last_sent_at >= timeout


def sweep(scheduler, sends, now=None):
    """Completes every send whose sender concluded on every rank of the scheduler's group (SGLang may
    release the request before or after, or never queue it); expires every send unconcluded
    ``KVSHIELD_PREFILL_SEND_TIMEOUT_S`` after its last chunk on some rank's clock, wherever SGLang holds its
    request: fenced and alarmed always; a queued request is failed and released, one SGLang still prefills is
    failed (its later chunks are dropped), one SGLang let go of is left as it is."""
    now = time.monotonic() if now is None else now
    timeout = settings.seconds(SEND_TIMEOUT, DEFAULT_SEND_TIMEOUT_S)
    tracked = _tracked(scheduler, sends)
    group = consensus.scheduler_group(scheduler)
    concluded = consensus.every_rank([_concluded(send.req.disagg_kv_sender) for send in tracked], group)
    late = consensus.any_rank([_overdue(send, now, timeout) for send in tracked], group)
    overdue = []
    for send, done, past in zip(tracked, concluded, late):
        if done:
            sends.complete(send.req)  # NOTE: also before SGLang's release (a PP rank awaiting consensus), or late
        elif past:
            overdue.append(send)
    queued = {id(r) for r in scheduler.disagg_prefill_inflight_queue}

    def error(r):
        return HandoffError(f"request {r.rid}: its KV transfer never concluded within {timeout:g} s; aborted, "
                            "pages quarantined", int(HTTPStatus.INTERNAL_SERVER_ERROR))

    release = []
    for send in overdue:
        req = send.req
        if not send.expired:  # NOTE: the request's part below is redone until SGLang holds it no more
            sends.expire(req)
            send.expired = True
            logger.error("kvshield: prefill send of request %s never concluded; its pages stay quarantined", req.rid)
        if req in sends.refused:
            continue  # NOTE: already failed; the inflight hook takes it out of SGLang's queue
        if id(req) in queued:
            release.append(req)
        elif not req.finished():  # SGLang still prefills it: failed; its later chunks are dropped
            fail_request(req, error(req))
            sends.refused.add(req)
        # NOTE: otherwise SGLang let go of it already (released, streamed): the fence and the alarm are all
    _finish_failed(scheduler, release, error)


def _concluded(sender):
    """Whether ``sender`` reports Success or Failed: the transport reads no more."""
    from sglang.srt.disaggregation.base import KVPoll

    return sender.poll() in (KVPoll.Success, KVPoll.Failed)


def _wrap_inflight(original):
    def process_disagg_prefill_inflight_queue(self, rids_to_check=None):
        sends = sends_of(self)
        if sends is None:
            return original(self, rids_to_check)
        refused = [r for r in self.disagg_prefill_inflight_queue if r in sends.refused]
        _finish_failed(self, refused, lambda r: None)  # NOTE: their abort was set when the claim was refused
        sends.refused.difference_update(refused)
        done = original(self, rids_to_check)
        for req in done:
            if req in sends.sends:
                sends.complete(req)
            else:
                PREFILL_ROOMS.release(req)  # NOTE: it never sent: the room may carry another request
        sweep(self, sends)
        return done

    return process_disagg_prefill_inflight_queue


def install_in_sglang():
    """Hooks ``SchedulerDisaggregationPrefillMixin``'s ``send_kv_chunk`` and
    ``process_disagg_prefill_inflight_queue``, which need ``disaggregation.prefill``'s ``release_kv_cache`` and
    ``maybe_release_metadata_buffer``: all or nothing (raises HookError naming what is missing)."""
    settings.seconds(SEND_TIMEOUT, DEFAULT_SEND_TIMEOUT_S)  # NOTE: a bad value refuses the start, not a step
    module = "sglang.srt.disaggregation.prefill"
    mixin = hooks.lookup(module, "SchedulerDisaggregationPrefillMixin")
    for name, params in (("send_kv_chunk", ("self", "req", "last_chunk", "end_idx")),
                         ("process_disagg_prefill_inflight_queue", ("self", "rids_to_check"))):
        qualname = f"SchedulerDisaggregationPrefillMixin.{name}"
        hooks.expect(hooks.lookup(module, qualname), qualname, params)
    hooks.expect(hooks.lookup(module, "release_kv_cache"), f"{module}.release_kv_cache", ("req", "tree_cache"))
    hooks.expect(hooks.lookup(module, "maybe_release_metadata_buffer"), f"{module}.maybe_release_metadata_buffer",
                 ("req", "allocator"))
    for name, wrap in (("send_kv_chunk", _wrap_send_kv_chunk),
                       ("process_disagg_prefill_inflight_queue", _wrap_inflight)):
        original = getattr(mixin, name)
        if not getattr(original, "_kvshield", False):
            hooked = wrap(original)
            hooked._kvshield = True
            setattr(mixin, name, hooked)
