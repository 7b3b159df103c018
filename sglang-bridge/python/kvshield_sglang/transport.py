"""What SGLang's KV transports tell kvshield about a transfer: coverage, acknowledgement, the peer's limit.

The decode hooks (:mod:`kvshield_sglang.disagg`) commit a request only against the coverage its
transport published, so every transport needs an adapter here, found by the class of the request's
``KVReceiver`` (its module and name, through the class hierarchy). A receiver without one fails closed:
its requests are refused with :func:`unsupported_message`, never assumed complete.

An adapter answers, for one receiver:

- ``covered_tokens(receiver)``: tokens ``[0, n)`` the prefill side reports it sent, or ``None`` when
  the transport has not said (refused);
- ``acknowledged(receiver)``: the transport's evidence that nothing more will be written into the
  request's pages (its writer claims may drop);
- ``peer(receiver)``: ``(peer id, the peer's effective limit in tokens or None)`` for the handshake;
- ``sender_tenant(receiver)``: the :func:`tenant_tag` of the tenant whose request the prefill side sent, or
  ``None`` when the transport has not said (refused): a transfer lands only in a reservation of the same
  tenant, so a colliding or reused bootstrap room never commits one tenant's KV into another's request;
- optionally ``forget(room)``: the decode side is done with the bootstrap room (drop per-room state).

An adapter whose ``limit_with_transfer`` is true (:class:`MetadataTransport`) instead binds each
receiver at admission (``bind``) and answers ``row(receiver, rid)`` at commit: covered tokens, the
peer's limit and the sender's tenant tag, all carried with the transfer.

Built in: SGLang's fake transport (``disaggregation/fake``). It moves no bytes itself; the prefill side's
``send`` calls are counted per bootstrap room (the pages each chunk carried × page size) and published
with the prefill pool's limit on :data:`LOOPBACK`, an in-process board (a room leaves it when the decode
side is done with it, :func:`forget`, or when its sender is gone). A decode process whose prefill
runs elsewhere finds nothing there and refuses (fail closed); SGLang's no-transfer requests, which use
this receiver, never read it (:mod:`kvshield_sglang.disagg`).

Transports that copy SGLang's metadata buffers (Mooncake, Ascend, NIXL, Mori): coverage rides in their
own metadata transfer (:class:`MetadataTransport`). kvshield appends one buffer to SGLang's
``MetadataBuffers`` (:func:`install_metadata`), so ``get_buf_infos()`` lists it last and every transport
that registers and copies the metadata buffers copies its row too. Prefill: the request's KV sender is
wrapped (:func:`arm_sender`) to count the pages its ``send`` calls carried and to write the row
(:data:`ROW_MAGIC`, bootstrap room, covered tokens, the prefill pool's effective limit, the request's
tenant tag, the KV buffers its transport carries) before the last
chunk's ``send`` hands over to the transport, which copies the metadata after that chunk's KV. Decode:
the receiver is wrapped (:meth:`MetadataTransport.bind`) to clear the row at ``send_metadata`` (before
prefill can write anything) and own its index until acknowledged (:func:`hold_indices`), and the row is read
at commit; only a row that passes is the acknowledgement. Register an adapter with :func:`register`
for any other transport.
"""

import gc
import hashlib
import logging
import weakref
import zlib
from http import HTTPStatus

import torch

from .errors import HandoffError

logger = logging.getLogger(__name__)

FAKE_RECEIVER = "sglang.srt.disaggregation.fake.conn.FakeKVReceiver"
FAKE_SENDER = "sglang.srt.disaggregation.fake.conn.FakeKVSender"
# Receivers of the transports that copy every buffer ``MetadataBuffers.get_buf_infos()`` lists, after the
# request's last KV chunk (disaggregation/{mooncake,nixl,mori}/conn.py; Ascend subclasses Mooncake's).
METADATA_RECEIVERS = (
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVReceiver",
    "sglang.srt.disaggregation.ascend.conn.AscendKVReceiver",
    "sglang.srt.disaggregation.nixl.conn.NixlKVReceiver",
    "sglang.srt.disaggregation.mori.conn.MoriKVReceiver",
)
# The coverage row: int64 words [magic, bootstrap room, covered tokens, prefill limit tokens, tenant tag, KV buffers the
# prefill carries, 0...]; 8 words = 64 bytes, the smallest RDMA transfer SGLang pads its own rows to.
ROW_MAGIC = 0x6B76736869640003  # "kvshid", format version 3 (2 carried no KV buffer count, 1 no tenant)
ROW_WORDS = 8


def tenant_tag(tenant):
    """A tenant's name as one int64 both sides of a handoff compute alike (BLAKE2b, 8 bytes): names are not
    secret, the tag only tells two tenants apart across processes."""
    digest = hashlib.blake2b(str(tenant).encode(), digest_size=8, person=b"kvshield-tenant").digest()
    return int.from_bytes(digest, "little", signed=True)


def qualname(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def peer_id(bootstrap_addr):
    """A stable id for a prefill server's bootstrap address (the handshake's peer)."""
    return zlib.crc32(str(bootstrap_addr).encode())


class _Sent:
    """Tokens one fake sender sent; held by the sender, so it dies with the sender."""

    __slots__ = ("tokens", "tenant", "__weakref__")

    def __init__(self):
        self.tokens = 0
        self.tenant = None  # the request's tenant tag, once the prefill hook armed the sender


class LoopbackBoard:
    """In-process publication for the fake transport: per bootstrap room the tokens its sender sent, per
    prefill bootstrap address its effective limit. Scheduler thread only.

    A room stays on the board until the decode side is done with it (:meth:`forget`: commit read,
    refused, aborted, expired) or its sender is gone (the board holds the count weakly), so a late send
    after the decode side forgot the room never puts it back."""

    def __init__(self):
        self._sent = weakref.WeakValueDictionary()
        self._limits = {}

    def publish_limit(self, bootstrap_addr, limit_tokens):
        self._limits[str(bootstrap_addr)] = int(limit_tokens)

    def limit(self, bootstrap_addr):
        return self._limits.get(str(bootstrap_addr))

    def open(self, room):
        """A sender for ``room`` starts: the count it keeps, published under the room unless another live
        sender's count is (a second sender on a live room, such as a no-transfer request naming it, never
        replaces the first one's count and tenant; its own decode side then finds no coverage)."""
        sent = _Sent()
        if self._sent.get(room) is not None:
            gc.collect()  # NOTE: a dropped sender sits in a reference cycle (its wrapped methods): garbage, not live
        if self._sent.get(room) is None:
            self._sent[room] = sent
        return sent

    def sent(self, room):
        sent = self._sent.get(room)
        return None if sent is None else sent.tokens

    def tenant(self, room):
        sent = self._sent.get(room)
        return None if sent is None else sent.tenant

    def forget(self, room):
        self._sent.pop(room, None)

    def rooms(self):
        """Rooms on the board now."""
        return list(self._sent.keys())


LOOPBACK = LoopbackBoard()


class FakeTransport:
    """SGLang's fake transport: coverage and the peer's limit from :data:`LOOPBACK`; acknowledged once
    the receiver concluded (the transport itself never writes, so nothing is left in flight)."""

    name = "fake"

    def covered_tokens(self, receiver):
        return LOOPBACK.sent(getattr(receiver, "_kvshield_room", None))

    def sender_tenant(self, receiver):
        return LOOPBACK.tenant(getattr(receiver, "_kvshield_room", None))

    def acknowledged(self, receiver):
        return receiver.conclude_state is not None

    def peer(self, receiver):
        addr = getattr(receiver, "_kvshield_addr", None)
        return peer_id(addr), LOOPBACK.limit(addr)

    def forget(self, room):
        LOOPBACK.forget(room)


class _Row:
    """What the decode side knows of one receiver's coverage row. ``landed``: a row this transfer's own (its index,
    room and tenant) was read after ``Success`` (the acknowledgement); ``released``: acknowledged, the row's
    metadata index may go back to SGLang; ``foreign``: another transfer was told to write at the index since."""

    __slots__ = ("rows", "owners", "room", "addr", "index", "landed", "released", "foreign", "held_free")

    def __init__(self, rows, owners, room, addr):
        self.rows, self.owners, self.room, self.addr, self.index, self.landed = rows, owners, room, addr, None, False
        self.released, self.foreign, self.held_free = False, False, None


def kv_buffers(kv_manager):
    """How many KV buffers a transfer through SGLang's ``kv_manager`` carries on this side (its ``kv_args.kv_data_ptrs``:
    the target's, then a draft model's where it has one); None when the manager does not say."""
    ptrs = getattr(getattr(kv_manager, "kv_args", None), "kv_data_ptrs", None)
    return None if ptrs is None else len(ptrs)


def _owners(metadata_buffers):
    """Metadata index -> the :class:`_Row` of the transfer last told to write there (decode side)."""
    owners = getattr(metadata_buffers, "kvshield_owners", None)
    if owners is None:
        owners = metadata_buffers.kvshield_owners = {}
    return owners


def hold_indices(allocator, metadata_buffers):
    """Makes SGLang's metadata index allocator (``ReqToMetadataIdxAllocator``) keep an index whose transfer is
    unacknowledged: SGLang frees it when it gives up on the request, but the transfer may still copy its metadata
    there, into the next request's row. Held indices go back at :meth:`MetadataTransport.release`; an expired
    transfer's stays held, as its pages do. Returns False when ``allocator`` has no ``free`` to hold."""
    if getattr(allocator, "_kvshield_held", None) is metadata_buffers:
        return True
    free = getattr(allocator, "free", None)
    if not callable(free):
        return False
    owners = _owners(metadata_buffers)

    def held_free(free_index, *a, **k):
        state = owners.get(int(free_index))
        if state is not None and not state.released:
            state.held_free = lambda: free(free_index, *a, **k)
            return None
        return free(free_index, *a, **k)

    allocator.free, allocator._kvshield_held = held_free, metadata_buffers
    return True


class MetadataTransport:
    """A transport that copies SGLang's metadata buffers: coverage and the prefill's limit come from the
    kvshield row at the request's metadata index.

    Evidence that the pages were written: the transport reported ``Success`` for the room (these
    transports report it only after the last chunk's KV writes and then the metadata copy completed)
    and the row, written by prefill before that last chunk, says how many tokens the chunks carried.
    The hooks record exactly those slots as written (:meth:`Handoff.record_covered`) and commit against
    them. Acknowledged once the commit read this transfer's own row (its index, never another transfer's since,
    its room, its tenant): after that ``Success`` nothing more is written. A refused row (missing, stale, another
    room's or tenant's, at an index another transfer was told to write) is no acknowledgement: the ``Success`` it
    came with may be another transfer's (these transports key status by room alone), and this one may still write.
    A transfer's metadata index stays its own until it is acknowledged (:func:`hold_indices`)."""

    name = "metadata buffers"
    limit_with_transfer = True

    def bind(self, receiver, req, metadata_buffers, index_allocator=None):
        """Wraps ``receiver.send_metadata`` to clear the row it names and own its index until acknowledged (SGLang's
        ``index_allocator`` holds it, :func:`hold_indices`); raises HandoffError (500) naming what this SGLang lacks
        when the row cannot be carried or its index cannot be held."""
        rows = getattr(metadata_buffers, "kvshield_coverage", None)
        if rows is None:
            raise HandoffError(
                f"request {req.rid} refused: transport {qualname(type(receiver))} carries coverage in SGLang's metadata "
                f"buffers, but {qualname(type(metadata_buffers)) if metadata_buffers is not None else 'this decode queue'} "
                "holds no kvshield row (MetadataBuffers without get_buf_infos, or built before kvshield was installed)",
                int(HTTPStatus.INTERNAL_SERVER_ERROR))
        send_metadata = getattr(receiver, "send_metadata", None)
        if not callable(send_metadata):
            raise HandoffError(f"request {req.rid} refused: receiver {qualname(type(receiver))} has no send_metadata, so "
                               "kvshield cannot clear the request's coverage row before the transfer",
                               int(HTTPStatus.INTERNAL_SERVER_ERROR))
        if not hold_indices(index_allocator, metadata_buffers):
            raise HandoffError(f"request {req.rid} refused: this decode queue's metadata index allocator cannot hold an "
                               "index until its transfer is acknowledged, so a late metadata copy could land in another "
                               "request's row", int(HTTPStatus.INTERNAL_SERVER_ERROR))
        owners = _owners(metadata_buffers)
        state = receiver._kvshield_row = _Row(rows, owners, int(req.bootstrap_room), f"{req.bootstrap_host}:{req.bootstrap_port}")

        def cleared_send_metadata(kv_indices, aux_index=None, *a, **k):
            if aux_index is not None:
                index = int(aux_index)
                holder = owners.get(index)
                if holder is not None and holder is not state and not holder.released:
                    holder.foreign = True  # NOTE: cannot happen while indices are held; neither row is then trusted
                    state.foreign = True
                owners[index] = state
                rows[index].zero_()  # NOTE: before prefill learns where to write, so before any copy
                state.index = index
            return send_metadata(kv_indices, aux_index, *a, **k)

        receiver.send_metadata = cleared_send_metadata

    def row(self, receiver, rid):
        """(covered tokens, the prefill's limit, the sender's tenant tag, the KV buffers the prefill carried) from the
        receiver's row; raises HandoffError (500) when the row is missing, not kvshield's (or an older format), or
        another room's."""
        state = getattr(receiver, "_kvshield_row", None)
        if state is None or state.index is None:
            raise HandoffError(f"handoff refused: request {rid} sent no metadata index over transport "
                               f"{qualname(type(receiver))}, so no coverage row can arrive", int(HTTPStatus.INTERNAL_SERVER_ERROR))
        if state.foreign or state.owners.get(state.index) is not state:
            raise HandoffError(f"handoff refused: metadata row {state.index} of request {rid} was handed to another "
                               "transfer while this one was unacknowledged", int(HTTPStatus.INTERNAL_SERVER_ERROR))
        magic, room, covered, limit, tenant, carried = state.rows[state.index, :6].tolist()
        if magic != ROW_MAGIC:
            raise HandoffError(f"handoff refused: no kvshield coverage row arrived for request {rid} (metadata row "
                               f"{state.index} holds {magic:#x}, not {ROW_MAGIC:#x}): the prefill side did not write it or "
                               f"transport {qualname(type(receiver))} did not copy it", int(HTTPStatus.INTERNAL_SERVER_ERROR))
        if room != state.room:
            raise HandoffError(f"handoff refused: the coverage row of request {rid} belongs to bootstrap room {room}, not "
                               f"{state.room} (a stale or late metadata write)", int(HTTPStatus.INTERNAL_SERVER_ERROR))
        return covered, limit, tenant, carried

    def accept(self, receiver):
        """The commit found the row this transfer's own (:meth:`row` passed, the tenant is the request's): its
        ``Success`` is this transfer's, the acknowledgement."""
        receiver._kvshield_row.landed = True

    def acknowledged(self, receiver):
        return receiver._kvshield_row.landed

    def release(self, receiver):
        """The transfer is acknowledged: its metadata index goes back to SGLang (if SGLang freed it already)."""
        state = getattr(receiver, "_kvshield_row", None)
        if state is None or state.released:
            return
        state.released = True
        if state.index is not None and state.owners.get(state.index) is state:
            del state.owners[state.index]
        if state.held_free is not None:
            held, state.held_free = state.held_free, None
            held()

    def peer(self, receiver):
        """(peer id, None): the prefill's limit arrives with the transfer, in the row."""
        return peer_id(receiver._kvshield_row.addr), None


def _registered_buffers(metadata_buffers):
    """The tensors of SGLang's ``MetadataBuffers`` that ``get_buf_infos()`` registers (every row a transport copies
    and the decode commit reads), or None when one of them is not an attribute kvshield can find."""
    infos = getattr(metadata_buffers, "get_buf_infos", None)
    if not callable(infos):
        return None
    by_ptr = {}
    for value in vars(metadata_buffers).values():
        if isinstance(value, torch.Tensor) and value.dim() >= 1:
            by_ptr.setdefault(value.data_ptr(), value)
    tensors = [by_ptr.get(p) for p in infos()[0]]
    return None if any(t is None for t in tensors) else tensors


def clear_rows_at_send(receiver, req, metadata_buffers):
    """A request with no transfer (SGLang's fake bootstrap host) is still committed by SGLang's decode from the
    metadata rows at its index (``_commit_transfer_to_req``: output id, cached tokens, logprobs, hidden states), which
    a previous request's transfer wrote: ``receiver.send_metadata`` (called with the index before the request can be
    committed) is wrapped to zero every registered metadata buffer's row there. Raises HandoffError (500) when the rows
    cannot be found or the receiver has no ``send_metadata``."""
    tensors = None if metadata_buffers is None else _registered_buffers(metadata_buffers)
    send_metadata = getattr(receiver, "send_metadata", None)
    if tensors is None or not callable(send_metadata):
        raise HandoffError(f"request {req.rid} refused: it declares no KV transfer, but kvshield cannot clear the metadata "
                           "row SGLang commits it from (no send_metadata, or metadata buffers kvshield cannot name), so "
                           "it could start from another request's output", int(HTTPStatus.INTERNAL_SERVER_ERROR))

    def cleared_send_metadata(kv_indices, aux_index=None, *a, **k):
        if aux_index is not None:
            for t in tensors:
                t[int(aux_index)].zero_()
        return send_metadata(kv_indices, aux_index, *a, **k)

    receiver.send_metadata = cleared_send_metadata


METADATA = MetadataTransport()
_ADAPTERS = {FAKE_RECEIVER: FakeTransport(), **dict.fromkeys(METADATA_RECEIVERS, METADATA)}


def register(receiver_cls, adapter):
    """Enables a transport: ``adapter`` answers for receivers of ``receiver_cls`` and its subclasses."""
    _ADAPTERS[qualname(receiver_cls)] = adapter


def adapter_for(receiver):
    """The adapter for ``receiver``'s class (nearest in its class hierarchy), or ``None``."""
    for cls in type(receiver).__mro__:
        adapter = _ADAPTERS.get(qualname(cls))
        if adapter is not None:
            return adapter
    return None


def forget(room):
    """The decode side is done with ``room`` (its coverage was read, or the request was given up on):
    adapters that keep per-room state drop it."""
    for adapter in {id(a): a for a in _ADAPTERS.values()}.values():
        drop = getattr(adapter, "forget", None)
        if drop is not None:
            drop(room)


def unsupported_message(receiver, rid):
    return (f"request {rid} refused: kvshield cannot read transfer coverage from transport "
            f"{qualname(type(receiver))}; supported: {', '.join(sorted(_ADAPTERS))}. "
            f"Enable a transport that carries coverage with kvshield_sglang.transport.register(<receiver class>, "
            f"adapter) reporting covered tokens, acknowledgements and the peer's limit")


def install_fake(conn_module):
    """Makes SGLang's fake sender count what each ``send`` carried and both ends remember their room."""
    sender, receiver = conn_module.FakeKVSender, conn_module.FakeKVReceiver
    if getattr(sender, "_kvshield", False):
        return
    s_init, s_send, r_init = sender.__init__, sender.send, receiver.__init__

    def sender_init(self, mgr, bootstrap_addr, bootstrap_room, *a, **k):
        s_init(self, mgr, bootstrap_addr, bootstrap_room, *a, **k)
        self._kvshield_sent = LOOPBACK.open(bootstrap_room)

    def send(self, kv_indices, *a, **k):
        s_send(self, kv_indices, *a, **k)
        # NOTE: kv_indices are page ids of this chunk; chunks go out in order, so the sum is the covered prefix.
        self._kvshield_sent.tokens += len(kv_indices) * int(self.kv_mgr.kv_args.page_size)

    def receiver_init(self, mgr, bootstrap_addr, bootstrap_room=None, *a, **k):
        r_init(self, mgr, bootstrap_addr, bootstrap_room, *a, **k)
        self._kvshield_room, self._kvshield_addr = bootstrap_room, bootstrap_addr

    sender.__init__, sender.send, receiver.__init__ = sender_init, send, receiver_init
    sender._kvshield = True


# ---------------------------------------------------------------- the coverage row (SGLang's metadata buffers)

def install_metadata(cls):
    """Gives SGLang's ``MetadataBuffers`` (``cls``) the kvshield row buffer (``kvshield_coverage``, int64
    ``(size, ROW_WORDS)`` on the buffers' device), listed last by ``get_buf_infos()``."""
    init, infos = cls.__init__, cls.get_buf_infos
    if getattr(infos, "_kvshield", False):
        return True

    def metadata_init(self, size, *a, **k):
        init(self, size, *a, **k)
        device = getattr(getattr(self, "output_ids", None), "device", "cpu")
        self.kvshield_coverage = torch.zeros((int(size), ROW_WORDS), dtype=torch.int64, device=device)

    def get_buf_infos(self):
        ptrs, data_lens, item_lens = infos(self)
        rows = getattr(self, "kvshield_coverage", None)
        if rows is None:  # NOTE: built before kvshield was installed: no row, so its requests are refused
            return ptrs, data_lens, item_lens
        row_bytes = ROW_WORDS * rows.element_size()
        return [*ptrs, rows.data_ptr()], [*data_lens, rows.shape[0] * row_bytes], [*item_lens, row_bytes]

    get_buf_infos._kvshield = True
    cls.__init__, cls.get_buf_infos = metadata_init, get_buf_infos
    return True


def arm_sender(sender, req, metadata_buffers, page_size, limit_tokens, *, tenant, carried):
    """Makes ``sender`` (the request's KV sender on the prefill side) count the pages its ``send`` calls
    carry and write the request's coverage row at its metadata index before the last chunk's ``send``.
    Covered tokens: pages sent × ``page_size``, capped by the request's length now; ``tenant`` is the
    request's (its tag rides in the row, and on the loopback board for SGLang's fake transport); ``carried``:
    the KV buffers this side's transport carries (:func:`kv_buffers`; 0: unknown). Returns whether the
    sender could be armed (else decode finds no row and refuses)."""
    rows = getattr(metadata_buffers, "kvshield_coverage", None)
    init, send = getattr(sender, "init", None), getattr(sender, "send", None)
    if rows is None or not callable(init) or not callable(send):
        logger.warning("kvshield: request %s: sender %s cannot publish coverage (%s); its decode side will refuse it",
                       req.rid, qualname(type(sender)), "no kvshield metadata row" if rows is None else "no init/send")
        return False
    cap, room, tag = len(req.origin_input_ids), int(req.bootstrap_room), tenant_tag(tenant)
    board = getattr(sender, "_kvshield_sent", None)
    if board is not None:
        board.tenant = tag
    plan = {"pages": None, "index": None, "sent": 0}

    def armed_init(num_pages, aux_index=None, *a, **k):
        plan["pages"], plan["index"] = int(num_pages), aux_index
        return init(num_pages, aux_index, *a, **k)

    def armed_send(kv_indices, *a, **k):
        plan["sent"] += len(kv_indices)
        if plan["pages"] is not None and plan["index"] is not None and plan["sent"] >= plan["pages"]:
            # NOTE: the transport copies the metadata after this (last) chunk's KV, so the row must be in place first.
            rows[int(plan["index"]), :6] = torch.tensor(
                [ROW_MAGIC, room, min(plan["sent"] * int(page_size), cap), int(limit_tokens), tag, int(carried)],
                dtype=torch.int64)
        return send(kv_indices, *a, **k)

    sender.init, sender.send = armed_init, armed_send
    return True
