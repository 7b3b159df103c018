from sglang.srt.disaggregation.fake.conn import FakeKVManager, FakeKVReceiver, FakeKVSender

__all__ = ["FakeKVManager", "FakeKVReceiver", "FakeKVSender"]
