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
- ``peer(receiver)``: ``(peer id, the peer's effective limit in tokens or None)`` for the handshake.

Built in: SGLang's fake transport (``disaggregation/fake``). It moves no bytes itself; the prefill side's
``send`` calls are counted per bootstrap room (the pages each chunk carried × page size) and published
with the prefill pool's limit on :data:`LOOPBACK`, an in-process board. A decode process whose prefill
runs elsewhere finds nothing there and refuses (fail closed). Other transports (Mooncake, NIXL, Ascend,
...) publish their transfer status over their own channels, which kvshield does not read yet: register
an adapter with :func:`register` to enable one.
"""

import zlib

FAKE_RECEIVER = "sglang.srt.disaggregation.fake.conn.FakeKVReceiver"
FAKE_SENDER = "sglang.srt.disaggregation.fake.conn.FakeKVSender"


def qualname(cls):
    return f"{cls.__module__}.{cls.__qualname__}"


def peer_id(bootstrap_addr):
    """A stable id for a prefill server's bootstrap address (the handshake's peer)."""
    return zlib.crc32(str(bootstrap_addr).encode())


class LoopbackBoard:
    """In-process publication for the fake transport: per bootstrap room the tokens sent, per prefill
    bootstrap address its effective limit. Scheduler thread only."""

    def __init__(self):
        self._sent = {}
        self._limits = {}

    def publish_limit(self, bootstrap_addr, limit_tokens):
        self._limits[str(bootstrap_addr)] = int(limit_tokens)

    def limit(self, bootstrap_addr):
        return self._limits.get(str(bootstrap_addr))

    def add_sent(self, room, tokens):
        self._sent[room] = self._sent.get(room, 0) + int(tokens)

    def sent(self, room):
        return self._sent.get(room)

    def forget(self, room):
        self._sent.pop(room, None)


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


def unsupported_message(receiver, rid):
    return (f"request {rid} refused: kvshield cannot read transfer coverage from transport "
            f"{qualname(type(receiver))}; supported: {', '.join(sorted(_ADAPTERS))}. Enable it with "
            f"kvshield_sglang.transport.register(<receiver class>, adapter) reporting covered tokens, "
            f"acknowledgements and the peer's limit")


def install_fake(conn_module):
    """Makes SGLang's fake sender count what each ``send`` carried and both ends remember their room."""
    sender, receiver = conn_module.FakeKVSender, conn_module.FakeKVReceiver
    if getattr(sender, "_kvshield", False):
        return
    s_init, s_send, r_init = sender.__init__, sender.send, receiver.__init__

    def sender_init(self, mgr, bootstrap_addr, bootstrap_room, *a, **k):
        s_init(self, mgr, bootstrap_addr, bootstrap_room, *a, **k)
        self._kvshield_room = bootstrap_room

    def send(self, kv_indices, *a, **k):
        s_send(self, kv_indices, *a, **k)
        # NOTE: kv_indices are page ids of this chunk; chunks go out in order, so the sum is the covered prefix.
        LOOPBACK.add_sent(self._kvshield_room, len(kv_indices) * int(self.kv_mgr.kv_args.page_size))

    def receiver_init(self, mgr, bootstrap_addr, bootstrap_room=None, *a, **k):
        r_init(self, mgr, bootstrap_addr, bootstrap_room, *a, **k)
        self._kvshield_room, self._kvshield_addr = bootstrap_room, bootstrap_addr

    sender.__init__, sender.send, receiver.__init__ = sender_init, send, receiver_init
    sender._kvshield = True
