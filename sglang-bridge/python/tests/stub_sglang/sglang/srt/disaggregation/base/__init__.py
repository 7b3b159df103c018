"""Mirrors ``sglang/srt/disaggregation/base/__init__.py``: the transport interfaces and ``KVPoll``."""

from sglang.srt.disaggregation.base.conn import BaseKVManager, BaseKVReceiver, BaseKVSender, KVArgs, KVPoll

__all__ = ["BaseKVManager", "BaseKVReceiver", "BaseKVSender", "KVArgs", "KVPoll"]
