import torch

from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator


class PagedTokenToKVPoolAllocator(BaseTokenToKVPoolAllocator):
    """Stock behaviour: a free list of pages, freed pages prepended, never scrubbed."""

    def __init__(self, size, page_size, dtype, device, kvcache, need_sort):
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
        self.num_pages = size // page_size
        self.clear()

    def clear(self):
        self.free_pages = torch.arange(1, self.num_pages + 1, dtype=torch.int64)

    def alloc(self, need_size):
        n = need_size // self.page_size
        if n > len(self.free_pages):
            return None
        out, self.free_pages = self.free_pages[:n], self.free_pages[n:]
        return (out[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)

    def free(self, free_index):
        self.free_pages = torch.cat((torch.unique(free_index // self.page_size), self.free_pages))
