import torch

from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator


class TokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Stock behaviour: a free list of slots, never scrubbed."""

    def __init__(self, size, dtype, device, kvcache, need_sort):
        super().__init__(size, 1, dtype, device, kvcache, need_sort)
        self.clear()

    def clear(self):
        self.free_pages = torch.arange(1, self.size + 1, dtype=torch.int64)

    def alloc(self, need_size):
        if need_size > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:need_size], self.free_pages[need_size:]
        return out

    def free(self, free_index):
        self.free_pages = torch.cat((self.free_pages, free_index))
