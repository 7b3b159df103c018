"""Tiny stand-ins for SGLang's KV pools (same attribute names), and a plain-Python reference of
SGLang's paged slot semantics."""

import torch


class FakeMHAPool:
    """Like SGLang's MHATokenToKVPool: one K and one V tensor per layer, (size + page_size, heads, head_dim)."""

    def __init__(self, size, page_size, layers=2, heads=1, head_dim=4, dtype=torch.float32):
        rows = size + page_size
        self.k_buffer = [torch.zeros(rows, heads, head_dim, dtype=dtype) for _ in range(layers)]
        self.v_buffer = [torch.zeros(rows, heads, head_dim, dtype=dtype) for _ in range(layers)]


class FakeMLAPool:
    def __init__(self, size, page_size, layers=2, dim=8):
        self.kv_buffer = [torch.zeros(size + page_size, 1, dim) for _ in range(layers)]


class FakeSWAKVPool(FakeMHAPool):
    pass


def ref_alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, page_size):
    """SGLang's extend semantics: per request, fill the prefix's last partial page, then whole new
    pages, then a new partial page, taking new pages from ``free_pages`` in order."""
    out, next_page = [], 0
    for prefix, seq, last in zip(prefix_lens, seq_lens, last_loc):
        pos = prefix
        while pos < seq and pos % page_size:
            last += 1
            out.append(last)
            pos += 1
        while pos < seq:
            page = free_pages[next_page]
            next_page += 1
            n = min(page_size, seq - pos)
            out.extend(page * page_size + k for k in range(n))
            pos += n
    return out, next_page
