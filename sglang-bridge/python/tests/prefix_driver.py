"""Drives a prefix cache the way SGLang's scheduler does, on CPU tensors, with SGLang's own ``Req``
(``init_next_round_input``: the match, with the request's ``RadixKey``: ``extra_key``, ``cache_salt``,
``limit``), ``ReqToTokenPool`` and ``CacheInitParams``: ``PrefillAdder.add_one_req`` (lock),
``evict_from_tree_cache`` + ``alloc_for_extend`` (evict on demand, extend, write the request's
``req_to_token`` row), the forward (writes each new token's KV), ``cache_unfinished_req`` between chunks,
and ``release_kv_cache`` (``cache_finished_req``, the row back). Used by the tests and the benchmark."""

from array import array

import torch
from sglang.srt.managers.schedule_batch import Req as _SglangReq
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.sampling.sampling_params import SamplingParams

from fakes import MHAPool


class RowReads(torch.Tensor):
    """A ``req_to_token`` table that counts reads of its values on the host (on a GPU each would be a
    device->host copy); indexing and device-side ops stay uncounted."""

    reads = 0
    _HOST = {torch.Tensor.tolist, torch.Tensor.item, torch.Tensor.numpy, torch.Tensor.__iter__}

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        if func in cls._HOST:
            RowReads.reads += 1
        return super().__torch_function__(func, types_, args, kwargs or {})


def row_pool(size, max_context_len):
    pool = ReqToTokenPool(size=size, max_context_len=max_context_len, device="cpu", enable_memory_saver=False)
    pool.req_to_token = pool.req_to_token.as_subclass(RowReads)
    return pool


def Req(rid, tenant, tokens, extra_key=None, cache_salt=None):  # noqa: N802 (SGLang's class name)
    """SGLang's ``Req`` for ``tokens``, with the tenant the plug-in resolved server-side."""
    req = _SglangReq(rid, "", array("q", tokens), SamplingParams(max_new_tokens=1), extra_key=extra_key,
                     cache_salt=cache_salt)
    req.kvshield_tenant = tenant
    return req


def kv_value(tenant, token, position):
    """The KV the fake forward computes for a token: a function of tenant, token and position."""
    return float(sum(map(ord, tenant)) * 1000 + token % 997 + position / 64)


class Engine:
    """One kvshield allocator, a prefix cache built through ``factory`` and the scheduler's calls."""

    def __init__(self, factory, level="ZERO", shared=None, size=64, page=4, sealer=None, layers=2, heads=1, head_dim=4):
        from kvshield_sglang import prefix_cache
        from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

        self.mod = prefix_cache
        self.page = page
        self.kv = MHAPool(size, page, layers=layers, heads=heads, head_dim=head_dim)
        settings = {"level": level, "strict": True, "advertisedContextTokens": size}
        if sealer:
            settings["sealerFactory"] = sealer
        self.alloc = PagedTokenToKVPoolAllocator(size, page, torch.float32, "cpu", self.kv, False,
                                                 kvshield_settings=settings)
        self.rows = row_pool(8, size)
        params = CacheInitParams(disable=False, req_to_token_pool=self.rows, token_to_kv_pool_allocator=self.alloc,
                                 page_size=page)
        self.cache = factory(params, shared)
        RowReads.reads = 0

    def read(self, slots):
        return self.kv.read(slots)

    def match(self, req):
        """SGLang's ``Req.init_next_round_input``: the match sets the request's prefix, last node and protected
        length; returns the prefix it matched."""
        req.init_next_round_input(self.cache)
        req.matched_tokens = len(req.prefix_indices)  # the match's length (the scheduler logs it as cached tokens)
        return req.prefix_indices

    def lookup(self, tokens, req=None, **key):
        """``match_prefix`` of a bare ``RadixKey`` (``key``: extra_key, cache_salt, limit) for ``req``."""
        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens), **key), req=req))

    def admit(self, req, chunk=None):
        """Match, lock, a request-pool row, and the extension by ``chunk`` tokens (default: all); returns the
        slots it computed, or None when the pool could not hold them (nothing allocated)."""
        self.match(req)
        self.cache.inc_lock_ref(req.last_node)
        self.rows.alloc([req])
        prefix = len(req.prefix_indices)
        if prefix:
            self.rows.write((req.req_pool_idx, slice(0, prefix)), req.prefix_indices)
        total = len(req.origin_input_ids) + len(req.output_ids)
        return self.extend(req, total if chunk is None else min(total, prefix + chunk))

    def extend(self, req, end):
        prefix = len(req.prefix_indices)
        need = end - prefix
        if self.alloc.available_size() < need + self.page:  # evict_from_tree_cache
            self.cache.evict(EvictParams(num_tokens=need + self.page))
            self.alloc.end_step()
        # NOTE: a request is its Req object (as the plug-in's plan_rows names it), never its rid
        self.alloc.set_plan([(req, req.kvshield_tenant, prefix, end)])
        p, s = torch.tensor([prefix]), torch.tensor([end])
        last_loc = self.rows.req_to_token[req.req_pool_idx, prefix - 1: prefix].long() if prefix else torch.tensor([-1])
        out = self.alloc.alloc_extend(p, p, s, s, last_loc.as_subclass(torch.Tensor), need)
        self.alloc.clear_plan()
        if out is None:
            return None
        req.set_extend_range(prefix, end)
        self.rows.write((req.req_pool_idx, slice(prefix, end)), out)
        tokens = req.origin_input_ids + req.output_ids
        for pos, slot in zip(range(prefix, end), out.tolist()):
            for b in self.kv.buffers():
                b[slot] = kv_value(req.kvshield_tenant, tokens[pos], pos)
        req.prefix_indices = self.rows.req_to_token[req.req_pool_idx, :end].long().as_subclass(torch.Tensor)
        return out

    def chunk_done(self, req, end):
        """After a chunk's forward: ``cache_unfinished_req(req, chunked=True)`` on the tokens so far (SGLang's
        ``get_fill_ids()``, up to the chunk's end)."""
        req.set_extend_range(0, end)
        self.cache.cache_unfinished_req(req, chunked=True)

    def finish(self, req, is_insert=True):
        """``release_kv_cache``: the cache settles the request's committed KV, the row goes back; a step ends."""
        committed = 0 if req.extend_range is None else req.extend_range.end
        self.cache.cache_finished_req(req, is_insert=is_insert, kv_len_to_handle=committed)
        self.rows.free(req)
        self.alloc.end_step()

    def run(self, req, chunk=None):
        """A whole request: admitted, prefilled (in chunks of ``chunk`` tokens), finished; returns its KV rows."""
        total = len(req.origin_input_ids)
        if self.admit(req, chunk) is None:
            self.finish(req, is_insert=False)
            return None
        done = len(req.prefix_indices)
        while done < total:
            self.chunk_done(req, done)
            done = min(total, done + chunk)
            if self.extend(req, done) is None:
                self.finish(req, is_insert=False)
                return None
        kv = self.read(self.rows.req_to_token[req.req_pool_idx, :total].long().as_subclass(torch.Tensor)).clone()
        self.finish(req)
        return kv

    def expected(self, tenant, tokens):
        """The KV a request of ``tenant`` computes for ``tokens``."""
        vals = torch.tensor([kv_value(tenant, t, i) for i, t in enumerate(tokens)], dtype=torch.float32)
        return vals[None, :, None, None].expand(2 * len(self.kv.k_buffer), -1, *self.kv.k_buffer[0].shape[1:])
