"""The transport of the disaggregation worlds: SGLang's fake transport (``disaggregation/fake``: its manager,
sender and receiver), wired to two pools in one process. SGLang selects a transport's classes through
``get_kv_class`` (:func:`install` puts the test ones there); only what a network would do is stood in for:

- :class:`LoopbackKVManager`: SGLang's ``FakeKVManager`` plus the prefill bootstrap table a networked manager
  fills from the bootstrap server (one prefill rank, data-parallel size 1);
- the receivers remember where the decode side asked its metadata to be written (``send_metadata``'s
  ``aux_index``); :func:`copy_metadata` is the metadata copy a transport makes (every buffer
  ``MetadataBuffers.get_buf_infos()`` lists, as Mooncake's ``send_aux`` does, or only the first, as older
  ones did). :class:`MetadataKVReceiver` is a Mooncake receiver in SGLang's class hierarchy (so kvshield
  reads coverage from the metadata row) whose control plane (bootstrap, zmq) is the fake one's.
"""

import ctypes
import types

from sglang.srt.disaggregation import decode as dmod
from sglang.srt.disaggregation import prefill as pmod
from sglang.srt.disaggregation.base.conn import BaseKVReceiver, KVPoll
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.disaggregation.fake.conn import FakeKVManager, FakeKVReceiver, FakeKVSender
from sglang.srt.disaggregation.mooncake.conn import MooncakeKVReceiver
from sglang.srt.disaggregation.utils import KVClassType, TransferBackend
from sglang.srt.environ import envs

FAKE, NIC, OPAQUE, METADATA = "loopback", "nic", "opaque", "metadata"


class _AnyPrefill(dict):
    def get(self, addr, default=None):
        return types.SimpleNamespace(dp_size=1, follow_bootstrap_room=False)


class LoopbackKVManager(FakeKVManager):
    """SGLang's fake manager plus the drain acknowledgements of SGLang's deferred decode KV release, as its networked
    managers keep them (``CommonKVManager``'s own methods; the acknowledgements themselves arrive over zmq there:
    :meth:`note_abort_ack` is what its receiver thread calls)."""

    register_deferred_abort_room = CommonKVManager.register_deferred_abort_room
    note_abort_ack = CommonKVManager.note_abort_ack
    is_abort_release_safe = CommonKVManager.is_abort_release_safe
    clear_deferred_abort_state = CommonKVManager.clear_deferred_abort_state

    def __init__(self, *a, **k):
        super().__init__(*a, **k)
        self.prefill_info_table = _AnyPrefill()
        self.enable_deferred_decode_kv_release = envs.SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE.get()
        self._deferred_abort_ack_tracker = {}


class _RemembersAux:
    aux_index = None

    def send_metadata(self, kv_indices, aux_index=None, *a, **k):
        self.aux_index = aux_index
        return super().send_metadata(kv_indices, aux_index, *a, **k)


class LoopbackKVReceiver(_RemembersAux, FakeKVReceiver):
    """SGLang's fake receiver (kvshield reads its coverage from the in-process board)."""


class NicKVReceiver(LoopbackKVReceiver):
    """A transport whose NIC writes decode memory itself and whose acknowledgement is lost."""


class OpaqueKVReceiver(BaseKVReceiver):
    """A transport kvshield knows nothing about (no adapter, no metadata copy)."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.conclude_state = None

    def init(self, prefill_dp_rank):
        pass

    def send_metadata(self, *a, **k):
        pass

    def poll(self):
        return KVPoll.WaitingForInput

    def failure_exception(self):
        raise RuntimeError("opaque transport failed")

    def clear(self):
        pass

    def abort(self):
        self.conclude_state = KVPoll.Failed


class MetadataKVReceiver(_RemembersAux, MooncakeKVReceiver):
    """A Mooncake receiver whose control plane is the fake one's: Success once the metadata landed
    (:func:`copy_metadata` marks it), Failed once aborted; bootstrapped with ``PREFILL_RANKS`` prefill ranks, which an
    abort notifies (``abort_notified``, as SGLang's receiver sets it after sending them its abort)."""

    PREFILL_RANKS = 1

    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.bootstrap_room, self.conclude_state, self.landed = bootstrap_room, None, False
        self.require_staging, self.kv_mgr, self.abort_notified = False, mgr, False
        self.bootstrap_infos = [{"rank": r} for r in range(self.PREFILL_RANKS)]

    def init(self, prefill_dp_rank):
        pass

    def send_metadata(self, kv_indices, aux_index=None, *a, **k):
        self.kv_indices, self.aux_index = list(kv_indices), aux_index

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        return KVPoll.Success if self.landed else KVPoll.WaitingForInput

    def failure_exception(self):
        raise RuntimeError("transfer aborted")

    def clear(self):
        pass

    def abort(self):
        self.conclude_state, self.abort_notified = KVPoll.Failed, True


RECEIVERS = {FAKE: LoopbackKVReceiver, NIC: NicKVReceiver, OPAQUE: OpaqueKVReceiver, METADATA: MetadataKVReceiver}


ROUTES = {}  # bootstrap room -> Route: where a metadata transport carries what a sender sends


class Route:
    """One transfer over a metadata transport: the prefill sender's pages land, raw bytes, in the decode pages
    the receiver named (``send_metadata``), in order; after the last page the metadata rows are copied (all of
    ``get_buf_infos()``, or ``buffers``: all but kvshield's row with -1, as a transport copying a fixed list)."""

    def __init__(self, src_kv, dst_kv, receiver, src_meta, dst_meta, page_size, buffers=None):
        self.src_kv, self.dst_kv, self.receiver, self.src_meta, self.dst_meta = src_kv, dst_kv, receiver, src_meta, dst_meta
        self.page_size, self.buffers, self.sent = page_size, buffers, 0

    def carry(self, sender, page_ids):
        ps = self.page_size
        for i, src_page in enumerate(int(p) for p in page_ids):
            dst_page = int(self.receiver.kv_indices[self.sent + i])
            for s, d in zip(self.src_kv.buffers(), self.dst_kv.buffers()):
                d[dst_page * ps:(dst_page + 1) * ps] = s[src_page * ps:(src_page + 1) * ps]
        self.sent += len(page_ids)
        if self.sent >= sender.num_pages:
            copy_metadata(self.src_meta, sender.aux_index, self.dst_meta, self.receiver.aux_index, self.receiver,
                          self.buffers)


class WireKVSender(FakeKVSender):
    """SGLang's fake sender whose sends travel a :class:`Route` when one is set for its room."""

    def __init__(self, mgr, bootstrap_addr, bootstrap_room, *a, **k):
        super().__init__(mgr, bootstrap_addr, bootstrap_room, *a, **k)
        self.room, self.num_pages, self.aux_index = bootstrap_room, None, None

    def init(self, num_pages, aux_index=None):
        self.num_pages, self.aux_index = num_pages, aux_index

    def send(self, kv_indices, state_indices=None, num_kv_tokens=None):
        super().send(kv_indices, state_indices, num_kv_tokens)
        route = ROUTES.get(self.room)
        if route is not None:
            route.carry(self, kv_indices)


def copy_metadata(src, src_index, dst, dst_index, receiver=None, buffers=None):
    """A transport's metadata copy: row ``src_index`` of every buffer (or the first ``buffers``) of ``src`` to
    row ``dst_index`` of ``dst``, raw bytes by the buffers' registrations (``get_buf_infos``)."""
    src_ptrs, _, lens = src.get_buf_infos()
    dst_ptrs, _, _ = dst.get_buf_infos()
    for s, d, n in list(zip(src_ptrs, dst_ptrs, lens))[:buffers]:
        ctypes.memmove(d + n * dst_index, s + n * src_index, n)
    if receiver is not None:
        receiver.landed = True


def install():
    """Routes SGLang's ``get_kv_class`` for the test transports (every other backend as before)."""
    for module in (dmod, pmod):
        original = module.get_kv_class

        def get_kv_class(backend, class_type, original=original):
            if backend not in RECEIVERS:
                return original(backend, class_type)
            if class_type == KVClassType.RECEIVER:
                return RECEIVERS[backend]
            if class_type == KVClassType.MANAGER:
                return LoopbackKVManager
            if class_type == KVClassType.SENDER:
                return WireKVSender
            return original(TransferBackend.FAKE, class_type)

        module.get_kv_class = get_kv_class
