"""Mirrors ``sglang/srt/disaggregation/fake/conn.py``: the transport SGLang uses for warmup requests and
tests. It moves no bytes; both ends report success as soon as their half of the protocol ran."""

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVReceiver, BaseKVSender, KVPoll


class FakeKVManager(BaseKVManager):
    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False):
        super().__init__(args, disaggregation_mode, server_args, is_mla_backend)
        self.kv_args = args


class FakeKVSender(BaseKVSender):
    def __init__(self, mgr, bootstrap_addr, bootstrap_room, dest_tp_ranks=None, pp_rank=0):
        self.kv_mgr = mgr
        self.has_sent = False
        self.conclude_state = None

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        if not self.has_sent:
            return KVPoll.WaitingForInput
        self.conclude_state = KVPoll.Success
        return KVPoll.Success

    def init(self, kv_indices, aux_index=None):
        pass

    def send(self, kv_indices, state_indices=None, token_position_offset=0):
        self.has_sent = True

    def failure_exception(self):
        raise Exception("Fake KVSender Exception")

    def abort(self):
        self.conclude_state = KVPoll.Failed


class FakeKVReceiver(BaseKVReceiver):
    def __init__(self, mgr, bootstrap_addr, bootstrap_room=None):
        self.bootstrap_done = False
        self.has_sent_metadata = False
        self.require_staging = False
        self.conclude_state = None

    def poll(self):
        if self.conclude_state is not None:
            return self.conclude_state
        if not self.bootstrap_done:
            return KVPoll.Bootstrapping
        if not self.has_sent_metadata:
            return KVPoll.WaitingForInput
        self.conclude_state = KVPoll.Success
        return KVPoll.Success

    def init(self, prefill_dp_rank):
        self.bootstrap_done = True

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None):
        self.has_sent_metadata = True

    def failure_exception(self):
        raise Exception("Fake KVReceiver Exception")

    def abort(self):
        self.conclude_state = KVPoll.Failed
