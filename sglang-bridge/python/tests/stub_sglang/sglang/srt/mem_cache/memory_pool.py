"""Stand-in for ``ReqToTokenPool`` of SGLang's ``python/sglang/srt/mem_cache/memory_pool.py``: one
row of KV slot indices per running request."""

import torch


class ReqToTokenPool:
    def __init__(self, size, max_context_len, device, enable_memory_saver=False):
        self.size = size
        self.max_context_len = max_context_len
        self.device = device
        self.req_to_token = torch.zeros((size, max_context_len), dtype=torch.int32, device=device)
        self.free_slots = list(range(size))

    def write(self, indices, values):
        self.req_to_token[indices] = values

    def available_size(self):
        return len(self.free_slots)

    def alloc(self, need_size):
        if need_size > len(self.free_slots):
            return None
        select, self.free_slots = self.free_slots[:need_size], self.free_slots[need_size:]
        return select

    def free(self, free_index):
        self.free_slots.extend([free_index] if isinstance(free_index, int) else list(free_index))

    def clear(self):
        self.free_slots = list(range(self.size))
