"""Verified prefill→decode handoffs on kvshield allocators (SGLang's disaggregation mode).

:class:`Handoff` is the small API over one allocator's pool; the Java side
(``dev.kvshield.bridge.handoff.HandoffBridge`` over allocator-api's ``HandoffReceiver`` and
``HandoffSender``) holds the reservation records, coverage, claims and verdicts. SGLang's queues are
hooked in :mod:`kvshield_sglang.disagg`.

Decode: ``reserve`` → the transport lands KV (``copy_from`` in-process, or ``record_written`` for a
transport that writes itself) → ``commit(rid, covered_tokens)`` → ``acknowledge`` on the transport's
completion/abort acknowledgement; ``abort``, ``expire`` (never a free), ``finish``.
Prefill: ``begin`` (admission first) → ``mark_sent`` → ``complete``.

A request is named by its SGLang ``Req`` object (a string names one outside SGLang's scheduler): the
allocator's per-object request id, never the client's ``rid``. Every failure raises
:class:`~kvshield_sglang.errors.HandoffError` carrying the HTTP status and the abort finish reason the
client must see.
"""

import logging
from http import HTTPStatus

import torch

from .errors import HandoffError, from_java, handoff_error

logger = logging.getLogger(__name__)


def _name(req):
    """What messages call a request: SGLang's rid, or the name a caller outside SGLang gave."""
    return getattr(req, "rid", req)


class Handoff:
    """Both sides of handoffs on one kvshield allocator; called from the scheduler thread only."""

    def __init__(self, allocator):
        import jpype

        self._jpype = jpype
        self.allocator = allocator
        self._j = jpype.JClass("dev.kvshield.bridge.handoff.HandoffBridge")(allocator._j)
        self._pages = jpype.JArray(jpype.JInt)(int(allocator._j.pageCount()))
        self._ps = allocator.page_size
        self._reserved = {}
        self._peer_limits = {}
        # State of the SGLang hooks (kvshield_sglang.disagg): the peer each admitted request reserves
        # against, the reservations whose transport has not acknowledged yet, and the admitted
        # no-transfer requests (rid → tenant) with counts of admitted and served ones.
        self.peer_of = {}
        self.inflight = {}
        self.no_transfer = {}
        self.no_transfer_admitted = 0
        self.no_transfer_served = 0

    def _call(self, fn, *args, status=HTTPStatus.INTERNAL_SERVER_ERROR):
        try:
            return fn(*args)
        except self._jpype.JException as e:
            raise handoff_error(from_java(e), status) from None

    def _move(self, fn, *args, status=HTTPStatus.INTERNAL_SERVER_ERROR):
        """A crossing that allocates, releases, claims or transfers pages (after the deferred frees)."""
        self.allocator.resolve_frees()
        return self._call(fn, *args, status=status)

    def _rid(self, req):
        """The pool's id of a request: its ``Req`` object (or a name outside SGLang), see the allocator's ``request_id``."""
        return self.allocator.request_id(req)

    # ------------------------------------------------------------ both sides

    def effective_limit(self):
        """This pool's effective request limit in tokens (what the peer must agree on)."""
        return int(self._j.effectiveLimitTokens())

    def handshake(self, peer, peer_limit_tokens):
        """Refuses a peer whose effective limit differs from ours; the message names both numbers."""
        self._call(self._j.handshake, int(peer), int(peer_limit_tokens), status=HTTPStatus.SERVICE_UNAVAILABLE)
        self._peer_limits[int(peer)] = int(peer_limit_tokens)

    def level_of(self, tenant):
        """The protection level (``NONE``, ``ZERO``, ``ENCRYPT``, ``COMPLIANCE``) ``tenant``'s pages get."""
        return str(self.allocator._j.pool().levelOf(self.allocator.tenant_id(tenant)))

    def admit_no_transfer(self, rid, tenant):
        """Admits a request that declares no KV transfer: it decodes over its own freshly handed-out pages,
        which a scrubbing level hands out zeroed. Under ``NONE`` (pages keep their bytes) raises
        :class:`HandoffError` (400) saying why."""
        level = self.level_of(tenant)
        if level == "NONE":
            raise HandoffError(f"request {_name(rid)} declares no KV transfer (SGLang's fake bootstrap host: warmup, health check "
                               f"or a client naming it) and would decode over pages handed out unscrubbed: tenant {tenant} "
                               "runs at protection level NONE, where a freed page keeps its KV; refused (use ZERO or above)",
                               int(HTTPStatus.BAD_REQUEST))
        self.no_transfer[rid] = tenant
        self.no_transfer_admitted += 1

    def serve_no_transfer(self, rid):
        """Whether ``rid`` is an admitted no-transfer request (counted as served and forgotten here)."""
        if self.no_transfer.pop(rid, None) is None:
            return False
        self.no_transfer_served += 1
        logger.info("kvshield: request %s decodes without a transfer over its own fresh pages", _name(rid))
        return True

    def ensure_peer(self, peer, peer_limit_tokens):
        """Shakes hands with ``peer`` unless it already did with this limit."""
        if self._peer_limits.get(int(peer)) != int(peer_limit_tokens):
            self.handshake(peer, peer_limit_tokens)

    # ------------------------------------------------------------ decode side

    def reserve(self, rid, tenant, seq_len, peer):
        """Reserves pages for ``seq_len`` tokens and takes the transfer's writer claims.

        Returns the token slots (int64, token order), or ``None`` when the pool cannot hold the request
        now (back-pressure: the request waits; :meth:`last_shortfall` says why). Too few claim slots (or
        no handshake) raise :class:`HandoffError` (503; too long: 400) with nothing reserved.
        """
        n = int(self._move(self._j.reserve, self._rid(rid), self.allocator.tenant_id(tenant), int(seq_len), int(peer),
                           self._pages, status=HTTPStatus.SERVICE_UNAVAILABLE))
        if n < 0:
            return None
        pages = torch.tensor(list(self._pages[:n]), dtype=torch.int64)
        self._reserved[rid] = pages, int(seq_len)
        slots = (pages[:, None] * self._ps + torch.arange(self._ps)).reshape(-1)
        return slots[: int(seq_len)]

    def reserved_pages(self, rid):
        return self._reserved[rid][0]

    def reserved_tokens(self, rid):
        """The tokens ``rid``'s reservation holds (what its commit's coverage must span); raises
        :class:`HandoffError` (500) when it holds none, as its commit would."""
        held = self._reserved.get(rid)
        if held is None:
            raise HandoffError(f"request {_name(rid)} holds no reservation on this decode pool",
                               int(HTTPStatus.INTERNAL_SERVER_ERROR))
        return held[1]

    def last_shortfall(self):
        return str(self._j.lastShortfall())

    def record_written(self, rid, page_index, from_slot, to_slot):
        """The transport reports it wrote slots ``[from_slot, to_slot)`` of reserved page ``page_index`` itself."""
        self._call(self._j.recordWritten, self._rid(rid), int(page_index), int(from_slot), int(to_slot))

    def record_covered(self, rid, covered_tokens):
        """The transport wrote tokens ``[0, covered_tokens)`` itself: records exactly those slots, page by page, up to
        the reservation's last token (a larger count names no slot of this request)."""
        pages, tokens = self._reserved[rid]
        covered = min(int(covered_tokens), tokens)
        for i in range(len(pages)):
            n = min(self._ps, covered - i * self._ps)
            if n <= 0:
                break
            self.record_written(rid, i, 0, n)

    def commit(self, rid, covered_tokens):
        """Commits the request, or raises :class:`HandoffError` (500) naming the coverage or the unwritten page."""
        result = self._move(self._j.commit, self._rid(rid), int(covered_tokens))
        if not result.committed():
            raise HandoffError(str(result.message()), int(HTTPStatus.INTERNAL_SERVER_ERROR))
        return True

    def abort(self, rid):
        self._move(self._j.abort, self._rid(rid))

    def acknowledge(self, rid):
        self._move(self._j.acknowledge, self._rid(rid))
        if not self.has_reservation(rid):
            self._reserved.pop(rid, None)

    def expire(self, rid):
        """The transfer never acknowledged: claims fenced, alarm raised, pages held back (never freed)."""
        self._move(self._j.expire, self._rid(rid))

    def finish(self, rid):
        self._move(self._j.finish, self._rid(rid))
        self._reserved.pop(rid, None)

    def has_reservation(self, rid):
        """Whether this pool still holds a reservation record for ``rid`` (not finished, not acknowledged after failing)."""
        return bool(self._j.hasReservation(self._rid(rid)))

    def outcome(self, rid):
        return str(self._call(self._j.outcome, self._rid(rid)))

    def unacknowledged(self):
        return int(self._j.unacknowledged())

    def alarms(self):
        return [str(a) for a in self._j.alarms()]

    # ------------------------------------------------------------ prefill side

    def begin(self, rid, tenant, seq_len, slots, peer):
        """Starts sending a request's KV from its slots; an oversized request raises (400) before any claim."""
        pages = torch.unique_consecutive(torch.as_tensor(slots, dtype=torch.int64).reshape(-1) // self._ps)
        self._move(self._j.begin, self._rid(rid), self.allocator.tenant_id(tenant), int(seq_len),
                   self._jpype.JArray(self._jpype.JInt)(pages.tolist()), int(peer))

    def mark_sent(self, rid, tokens):
        self._call(self._j.markSent, self._rid(rid), int(tokens))

    def sent_tokens(self, rid):
        return int(self._call(self._j.sentTokens, self._rid(rid)))

    def complete(self, rid):
        self._move(self._j.complete, self._rid(rid))

    def copy_to(self, decode, rid, from_page=0, to_page=None, *, decode_rid=None):
        """The in-process transport: copies pages ``[from_page, to_page)`` of every KV buffer from ``rid``'s send
        to ``decode_rid``'s reservation on ``decode`` (default ``rid``: a name both sides share; SGLang's prefill
        and decode servers each hold their own ``Req`` of one request) through both sides' claims (a fenced,
        dropped or stale claim raises and writes nothing). Returns tokens copied."""
        decode_rid = rid if decode_rid is None else decode_rid
        if to_page is None:
            to_page = len(decode.reserved_pages(decode_rid))
        return int(self._move(self._j.copyTo, decode._j, self._rid(rid), decode._rid(decode_rid), int(from_page),
                              int(to_page)))
