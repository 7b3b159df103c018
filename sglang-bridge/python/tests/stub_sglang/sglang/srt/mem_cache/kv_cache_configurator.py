"""Stand-in for SGLang's ``mem_cache/kv_cache_configurator.py``: only the names and signatures
kvshield's coverage hook checks and wraps (the stub's tests build their pools directly)."""

from dataclasses import dataclass


@dataclass(slots=True, kw_only=True)
class KVCacheConfigurator:
    server_args: object
    is_draft_worker: bool
    page_size: int

    def _init_pools(self, *, sizes, req_to_token_pool, token_to_kv_pool_allocator):
        raise NotImplementedError("the stand-in builds no pools")

    def _build_token_to_kv_pool_allocator(self, *, sizes, token_to_kv_pool, is_dsv4_model, req_to_token_pool,
                                          token_to_kv_pool_allocator):
        raise NotImplementedError("the stand-in builds no allocators")
