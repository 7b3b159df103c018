# Imports the allocator classes by name at import time, as SGLang's model runner does.
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: F401
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: F401


class ModelRunner:
    """Launches a forward pass (here: records what it launched) on the current stream."""

    def __init__(self, token_to_kv_pool_allocator, launched):
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.launched = launched

    def forward(self, batch):
        self.launched.append(("forward", batch))
        return batch
