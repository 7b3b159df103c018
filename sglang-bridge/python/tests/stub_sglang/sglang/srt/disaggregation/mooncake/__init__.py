from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager, MooncakeKVReceiver

__all__ = ["MooncakeKVManager", "MooncakeKVReceiver"]
