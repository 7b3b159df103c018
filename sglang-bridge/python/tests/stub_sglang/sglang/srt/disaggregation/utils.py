"""Mirrors parts of ``sglang/srt/disaggregation/utils.py``: the abort helper, the transport registry
(``TransferBackend``, ``KVClassType``, ``get_kv_class``), the fake-transfer marker and the metadata
buffers (``ReqToMetadataIdxAllocator``, ``MetadataBuffers``)."""

from collections import deque
from enum import Enum

import torch

FAKE_BOOTSTRAP_HOST = "2.2.2.2"


class ReqToMetadataIdxAllocator:
    """Hands out metadata buffer rows; a freed row goes to the back of the line."""

    def __init__(self, size):
        self.size = size
        self.free_slots = deque(range(size))

    def available_size(self):
        return len(self.free_slots)

    def alloc(self):
        return self.free_slots.popleft() if self.free_slots else None

    def free(self, free_index):
        self.free_slots.append(free_index)


class MetadataBuffers:
    """Per-request rows of the first output token's metadata, copied prefill → decode by the transports
    after the last KV chunk (each buffer as listed by ``get_buf_infos``: pointer, bytes, row bytes).
    Left out: the logprob and speculative-decoding buffers, NPU/NVLink placement."""

    def __init__(self, size, hidden_size, hidden_states_dtype, max_top_logprobs_num=128, custom_mem_pool=None):
        self.output_ids = torch.zeros((size, 16), dtype=torch.int32)
        self.cached_tokens = torch.zeros((size, 16), dtype=torch.int32)
        self.output_hidden_states = torch.zeros((size, hidden_size), dtype=hidden_states_dtype)
        # SGLang: torch.uint64 (int64 on NPU); torch 1.13 has no uint64.
        self.bootstrap_room = torch.zeros((size, 8), dtype=torch.int64)

    def _bufs(self):
        return self.output_ids, self.cached_tokens, self.output_hidden_states, self.bootstrap_room

    def get_buf_infos(self):
        bufs = self._bufs()
        # SGLang reads .nbytes, which torch 1.13 lacks
        return ([b.data_ptr() for b in bufs], [b.numel() * b.element_size() for b in bufs],
                [b[0].numel() * b.element_size() for b in bufs])

    def get_buf(self, idx):
        return tuple(b[idx] for b in self._bufs())

    def set_buf(self, req):
        self.output_ids[req.metadata_buffer_index][0] = req.output_ids[0]
        self.bootstrap_room[req.metadata_buffer_index, 0] = req.bootstrap_room if req.bootstrap_room is not None else 0


class DisaggregationMode(Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class TransferBackend(Enum):
    MOONCAKE = "mooncake"
    NIXL = "nixl"
    FAKE = "fake"


class KVClassType(Enum):
    KVARGS = "kvargs"
    MANAGER = "manager"
    SENDER = "sender"
    RECEIVER = "receiver"


def get_kv_class(transfer_backend, class_type):
    """The stand-in carries the fake transport and Mooncake's (manager, sender, receiver); SGLang imports
    NIXL/Ascend/... here too."""
    from sglang.srt.disaggregation.base.conn import KVArgs

    if transfer_backend == TransferBackend.FAKE:
        from sglang.srt.disaggregation.fake import FakeKVManager, FakeKVReceiver, FakeKVSender

        classes = {KVClassType.KVARGS: KVArgs, KVClassType.MANAGER: FakeKVManager, KVClassType.SENDER: FakeKVSender,
                   KVClassType.RECEIVER: FakeKVReceiver}
    elif transfer_backend == TransferBackend.MOONCAKE:
        from sglang.srt.disaggregation.mooncake import MooncakeKVManager, MooncakeKVReceiver, MooncakeKVSender

        classes = {KVClassType.KVARGS: KVArgs, KVClassType.MANAGER: MooncakeKVManager,
                   KVClassType.SENDER: MooncakeKVSender, KVClassType.RECEIVER: MooncakeKVReceiver}
    else:
        classes = {}
    if class_type not in classes:
        raise ValueError(f"the stand-in has no {class_type} of the {transfer_backend} transport")
    return classes[class_type]


class FINISH_ABORT:
    def __init__(self, message=None, status_code=None):
        self.message, self.status_code = message, status_code

    def to_json(self):
        return {"type": "abort", "message": self.message, "status_code": self.status_code}


def prepare_abort(req, error_message, status_code=None):
    req.finished_reason = FINISH_ABORT(error_message, status_code)


def kv_to_page_num(num_kv_indices, page_size):
    return (num_kv_indices + page_size - 1) // page_size


def kv_to_page_indices(kv_indices, page_size):
    """SGLang keeps this in ``mem_cache/common.py``: one page id per page the token slots touch, in order."""
    return kv_indices[::page_size] // page_size
