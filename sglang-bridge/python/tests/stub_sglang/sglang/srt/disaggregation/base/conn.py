"""Mirrors ``sglang/srt/disaggregation/base/conn.py``: what every KV transport implements (a manager per
side, a sender per prefill request, a receiver per decode request) and the transfer states."""


class KVPoll:
    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class KVArgs:
    """The buffers a manager transfers between: per KV buffer (layer × K/V) its address, bytes and page
    bytes (``get_contiguous_buf_infos``), per metadata buffer the same (``MetadataBuffers.get_buf_infos``)."""

    kv_data_ptrs: list = []
    kv_data_lens: list = []
    kv_item_lens: list = []
    aux_data_ptrs: list = []
    aux_data_lens: list = []
    aux_item_lens: list = []
    page_size: int = 1


class BaseKVManager:
    def __init__(self, args, disaggregation_mode, server_args, is_mla_backend=False):
        pass


class BaseKVSender:
    def init(self, num_kv_indices, aux_index=None):
        raise NotImplementedError

    def send(self, kv_indices, state_indices=None):
        """Sends the KV of ``kv_indices`` (page ids of the prefill pool), one chunk of the request."""
        raise NotImplementedError

    def poll(self):
        raise NotImplementedError

    def failure_exception(self):
        raise NotImplementedError

    def abort(self):
        raise NotImplementedError


class BaseKVReceiver:
    def init(self, prefill_dp_rank):
        raise NotImplementedError

    def send_metadata(self, kv_indices, aux_index=None, state_indices=None, decode_prefix_len=None):
        """Tells the prefill side where to write: ``kv_indices`` are page ids of the decode pool."""
        raise NotImplementedError

    def poll(self):
        raise NotImplementedError

    def failure_exception(self):
        raise NotImplementedError

    def abort(self):
        raise NotImplementedError

    def clear(self):
        pass
