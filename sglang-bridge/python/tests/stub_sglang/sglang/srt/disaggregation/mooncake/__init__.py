from sglang.srt.disaggregation.mooncake.conn import MooncakeKVManager, MooncakeKVReceiver, MooncakeKVSender

__all__ = ["MooncakeKVManager", "MooncakeKVReceiver", "MooncakeKVSender"]
