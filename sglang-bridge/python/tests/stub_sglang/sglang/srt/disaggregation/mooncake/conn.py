"""Mirrors ``sglang/srt/disaggregation/mooncake/conn.py`` (with ``common/conn.py``'s
``CommonKVManager.update_status``) between two pools in one process.

Prefill: the sender counts the pages of each ``send`` against ``init``'s page count; the chunk that
reaches it is the last, and the manager transfers that chunk's KV pages and then every metadata
buffer's row (``send_aux`` walks all of ``kv_args.aux_data_ptrs``), then reports ``Success`` for the
room to both sides. Bytes move as the transfer engine moves them: raw copies between the registered
addresses (``kv_args.kv_data_ptrs``/``aux_data_ptrs``), by page id and metadata index.

Decode: a receiver's state is its manager's per-room status; ``send_metadata`` tells prefill where to
write (the decode page ids and metadata index of the room).

Left out: the transfer engine, ZMQ sockets, the bootstrap server (here a dict from room to the decode
side's destination, ``_DESTINATIONS``), the transfer worker threads (transfers run inside ``send``; in
SGLang they run later on a worker, which reads the metadata no earlier), staging, heartbeats, TP/PP.
"""

import ctypes

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVReceiver, BaseKVSender, KVPoll

# room → (decode manager, decode page ids, decode metadata index): what send_metadata tells prefill over ZMQ.
_DESTINATIONS = {}


class MooncakeKVManager(BaseKVManager):
    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False):
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        self.kv_args = args
        self.request_status = {}

    def check_status(self, bootstrap_room):
        return self.request_status[bootstrap_room]

    def update_status(self, bootstrap_room, status):
        if bootstrap_room not in self.request_status:
            if status == KVPoll.Failed:  # a cleared room is never resurrected as Failed
                return
            self.request_status[bootstrap_room] = status
        elif status == KVPoll.Failed:
            self.request_status[bootstrap_room] = KVPoll.Failed
        else:
            self.request_status[bootstrap_room] = max(self.request_status[bootstrap_room], status)

    def send_kvcache(self, prefill_kv_indices, dst_kv_args, dst_kv_indices):
        for src, dst, item_len in zip(self.kv_args.kv_data_ptrs, dst_kv_args.kv_data_ptrs, self.kv_args.kv_item_lens):
            for s, d in zip(prefill_kv_indices.tolist(), dst_kv_indices.tolist()):
                ctypes.memmove(dst + int(d) * item_len, src + int(s) * item_len, item_len)

    def send_aux(self, prefill_aux_index, dst_kv_args, dst_aux_index):
        for i, length in enumerate(self.kv_args.aux_item_lens):
            ctypes.memmove(dst_kv_args.aux_data_ptrs[i] + length * dst_aux_index,
                           self.kv_args.aux_data_ptrs[i] + length * prefill_aux_index, length)

    def add_transfer_request(self, bootstrap_room, kv_indices, index_slice, is_last, aux_index=None):
        decode_mgr, dst_kv_indices, dst_aux_index = _DESTINATIONS[bootstrap_room]
        self.send_kvcache(kv_indices, decode_mgr.kv_args, dst_kv_indices[index_slice])
        if is_last:
            self.send_aux(aux_index, decode_mgr.kv_args, dst_aux_index)
            self.update_status(bootstrap_room, KVPoll.Success)
            decode_mgr.update_status(bootstrap_room, KVPoll.Success)


class MooncakeKVSender(BaseKVSender):
    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=0):
        self.kv_mgr, self.bootstrap_room = mgr, bootstrap_room
        self.kv_mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)
        self.aux_index, self.num_kv_indices, self.curr_idx = None, None, 0
        self.conclude_state = None

    def init(self, num_kv_indices, aux_index=None):
        self.num_kv_indices, self.aux_index = num_kv_indices, aux_index

    def send(self, kv_indices, state_indices=None):
        index_slice = slice(self.curr_idx, self.curr_idx + len(kv_indices))
        self.curr_idx += len(kv_indices)
        is_last = self.curr_idx == self.num_kv_indices
        self.kv_mgr.add_transfer_request(self.bootstrap_room, kv_indices, index_slice, is_last,
                                         aux_index=self.aux_index if is_last else None)

    def poll(self):
        if self.conclude_state is None:
            status = self.kv_mgr.check_status(self.bootstrap_room)
            if status in (KVPoll.Success, KVPoll.Failed):
                self.conclude_state = status
            return status
        return self.conclude_state


class MooncakeKVReceiver(BaseKVReceiver):
    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.kv_mgr, self.bootstrap_addr, self.bootstrap_room = mgr, bootstrap_addr, bootstrap_room
        self.conclude_state = None
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, prefill_dp_rank):
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.WaitingForInput)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None):
        _DESTINATIONS[self.bootstrap_room] = (self.kv_mgr, kv_indices, aux_index)
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Transferring)

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def abort(self):
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Failed)

    def clear(self):
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)
