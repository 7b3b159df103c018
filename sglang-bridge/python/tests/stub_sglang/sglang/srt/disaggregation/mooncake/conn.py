"""Mirrors the decode side of ``sglang/srt/disaggregation/mooncake/conn.py`` (with ``common/conn.py``'s
``CommonKVManager.update_status``): a receiver's state is its manager's per-room status. In SGLang the
decode thread sets that status from the prefill ranks' messages ``(room, status, prefill_rank)``; no
message says how many pages or tokens were written, which is why kvshield refuses this transport.

Left out: the transfer engine, ZMQ sockets and threads, bootstrap-server queries, the status messages
themselves, staging, heartbeats and the prefill side.
"""

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVReceiver, KVPoll


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


class MooncakeKVReceiver(BaseKVReceiver):
    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.kv_mgr, self.bootstrap_addr, self.bootstrap_room = mgr, bootstrap_addr, bootstrap_room
        self.conclude_state = None
        mgr.update_status(bootstrap_room, KVPoll.Bootstrapping)

    def init(self, prefill_dp_rank):
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.WaitingForInput)

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None):
        self.kv_mgr.update_status(self.bootstrap_room, KVPoll.Transferring)

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        status = self.kv_mgr.check_status(self.bootstrap_room)
        if status in (KVPoll.Success, KVPoll.Failed):
            self.conclude_state = status
        return status

    def clear(self):
        self.kv_mgr.request_status.pop(self.bootstrap_room, None)
