"""Stand-in for SGLang's per-request allocation planning and request release."""

import torch


def alloc_for_extend(batch):
    alloc = batch.tree_cache.token_to_kv_pool_allocator
    prefix = torch.tensor(batch.prefix_lens, dtype=torch.int64)
    out = alloc.alloc_extend(prefix, prefix, batch.seq_lens, batch.seq_lens_cpu, torch.full_like(prefix, -1),
                             batch.extend_num_tokens)
    if out is None:
        raise RuntimeError("Prefill out of memory")
    start = 0
    for req, p, s in zip(batch.reqs, batch.prefix_lens, batch.seq_lens_cpu.tolist()):
        req.slots = out[start:start + s - p]
        start += s - p
    return out


def release_kv_cache(req, tree_cache, is_insert=True):
    tree_cache.token_to_kv_pool_allocator.free(req.slots)
