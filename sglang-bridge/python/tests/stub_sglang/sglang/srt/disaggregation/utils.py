"""Mirrors parts of ``sglang/srt/disaggregation/utils.py``: the abort helper, the transport registry
(``TransferBackend``, ``KVClassType``, ``get_kv_class``) and the fake-transfer marker."""

from enum import Enum

FAKE_BOOTSTRAP_HOST = "2.2.2.2"


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
    """The stand-in carries the fake transport and Mooncake's decode side (manager, receiver); SGLang
    imports NIXL/Ascend/... here too."""
    from sglang.srt.disaggregation.base.conn import KVArgs

    if transfer_backend == TransferBackend.FAKE:
        from sglang.srt.disaggregation.fake import FakeKVManager, FakeKVReceiver, FakeKVSender

        classes = {KVClassType.KVARGS: KVArgs, KVClassType.MANAGER: FakeKVManager, KVClassType.SENDER: FakeKVSender,
                   KVClassType.RECEIVER: FakeKVReceiver}
    elif transfer_backend == TransferBackend.MOONCAKE:
        from sglang.srt.disaggregation.mooncake import MooncakeKVManager, MooncakeKVReceiver

        classes = {KVClassType.KVARGS: KVArgs, KVClassType.MANAGER: MooncakeKVManager,
                   KVClassType.RECEIVER: MooncakeKVReceiver}
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


def kv_to_page_indices(kv_indices, page_size):
    """SGLang keeps this in ``mem_cache/common.py``: one page id per page the token slots touch, in order."""
    return kv_indices[::page_size] // page_size
