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
- optionally ``forget(room)``: the decode side is done with the bootstrap room (drop per-room state).

Built in: SGLang's fake transport (``disaggregation/fake``). It moves no bytes itself; the prefill side's
``send`` calls are counted per bootstrap room (the pages each chunk carried × page size) and published
with the prefill pool's limit on :data:`LOOPBACK`, an in-process board (a room leaves it when the decode
side is done with it, :func:`forget`, or when its sender is gone). A decode process whose prefill
runs elsewhere finds nothing there and refuses (fail closed).

Mooncake, NIXL and Ascend (a Mooncake subclass) carry no coverage across processes, so they stay
refused, each with the reason (:data:`NO_EVIDENCE`). Register an adapter with :func:`register` for a
transport that does.
"""

import weakref
import zlib

FAKE_RECEIVER = "sglang.srt.disaggregation.fake.conn.FakeKVReceiver"
FAKE_SENDER = "sglang.srt.disaggregation.fake.conn.FakeKVSender"
_SUCCESS_MEANS = ("Success only says the prefill sender reached the end of its own page list, which for a "
                  "request prefill shrank is shorter than the pages decode reserved")
# Why a transport SGLang ships cannot be read (receiver class → reason), from its disaggregation/*/conn.py.
NO_EVIDENCE = {
    "sglang.srt.disaggregation.mooncake.conn.MooncakeKVReceiver": (
        "Mooncake's completion status for a room is (room, status, prefill rank) per prefill rank, with no count "
        f"of pages or tokens written; {_SUCCESS_MEANS}"),
    "sglang.srt.disaggregation.nixl.conn.NixlKVReceiver": (
        "NIXL's notifications name (room, chunk id, last chunk) per landed chunk, not the pages a chunk wrote; "
        f"{_SUCCESS_MEANS}"),
}


def qualname(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def peer_id(bootstrap_addr):
    """A stable id for a prefill server's bootstrap address (the handshake's peer)."""
    return zlib.crc32(str(bootstrap_addr).encode())


class _Sent:
    """Tokens one fake sender sent; held by the sender, so it dies with the sender."""

    __slots__ = ("tokens", "__weakref__")

    def __init__(self):
        self.tokens = 0


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
        """A sender for ``room`` starts: the count it keeps, published under the room."""
        sent = self._sent[room] = _Sent()
        return sent

    def sent(self, room):
        sent = self._sent.get(room)
        return None if sent is None else sent.tokens

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

    def acknowledged(self, receiver):
        return receiver.conclude_state is not None

    def peer(self, receiver):
        addr = getattr(receiver, "_kvshield_addr", None)
        return peer_id(addr), LOOPBACK.limit(addr)

    def forget(self, room):
        LOOPBACK.forget(room)


_ADAPTERS = {FAKE_RECEIVER: FakeTransport()}


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
    why = next((NO_EVIDENCE[qualname(c)] for c in type(receiver).__mro__ if qualname(c) in NO_EVIDENCE), None)
    return (f"request {rid} refused: kvshield cannot read transfer coverage from transport "
            f"{qualname(type(receiver))}{f' ({why})' if why else ''}; supported: {', '.join(sorted(_ADAPTERS))}. "
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
