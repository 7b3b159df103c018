"""Stand-in for SGLang's ``python/sglang/srt/mem_cache/base_prefix_cache.py``: the parameter and
result types of a prefix cache and the abstract base the scheduler calls (abstract methods,
defaults of the size queries, events, capability probes)."""

import dataclasses
from abc import ABC, abstractmethod
from typing import Any, NamedTuple, Optional

import torch


@dataclasses.dataclass
class MatchPrefixParams:
    key: Any
    cow_mamba: bool = False
    req: Optional[Any] = None


@dataclasses.dataclass
class EvictParams:
    num_tokens: int = 0
    swa_num_tokens: int = 0
    mamba_num: int = 0


@dataclasses.dataclass
class EvictResult:
    num_tokens_evicted: int = 0
    swa_num_tokens_evicted: int = 0
    mamba_num_evicted: int = 0


@dataclasses.dataclass
class IncLockRefResult:
    delta: Optional[int] = None
    node_id: Optional[int] = None


@dataclasses.dataclass
class DecLockRefParams:
    node_id: Optional[int] = None


@dataclasses.dataclass
class DecLockRefResult:
    delta: Optional[int] = None


class MatchResult(NamedTuple):
    device_indices: torch.Tensor
    last_device_node: Any
    last_host_node: Any
    best_match_node: Any
    host_hit_length: int = 0
    cache_protected_len: Optional[int] = None


class BasePrefixCache(ABC):
    kv_events = None
    cache_controller = None
    metrics_collector = None

    @abstractmethod
    def reset(self):
        pass

    @abstractmethod
    def match_prefix(self, params: MatchPrefixParams) -> MatchResult:
        pass

    @abstractmethod
    def cache_finished_req(self, req, is_insert: bool = True, **kwargs):
        pass

    @abstractmethod
    def cache_unfinished_req(self, req, **kwargs):
        pass

    @abstractmethod
    def evict(self, params: EvictParams) -> EvictResult:
        pass

    @abstractmethod
    def inc_lock_ref(self, node: Any) -> IncLockRefResult:
        pass

    @abstractmethod
    def dec_lock_ref(self, node: Any, params: Optional[DecLockRefParams] = None) -> DecLockRefResult:
        pass

    def evictable_size(self):
        return 0

    def protected_size(self):
        return 0

    def total_size(self):
        raise NotImplementedError()

    def pretty_print(self):
        raise NotImplementedError()

    def take_events(self):
        return [] if self.kv_events is None else self.kv_events.take()

    def root_node_handle(self, extra_key=None):
        return self.root_node

    def is_root(self, node):
        return node is self.root_node

    def supports_swa(self):
        return False

    def supports_mamba(self):
        return False

    def is_chunk_cache(self):
        return False

    def is_tree_cache(self):
        return not self.is_chunk_cache()

    def available_and_evictable_str(self):
        available_size = self.token_to_kv_pool_allocator.available_size()
        evictable_size = self.evictable_size()
        return f"Available tokens: {available_size + evictable_size} ({available_size=} + {evictable_size=})\n"
