"""The tenant-scoped, sealed prefix cache as an SGLang radix-cache backend (``--radix-cache-backend kvshield``).

Matching is scoped by tenant for every tenant (a cross-tenant prefix hit is a timing side channel);
an operator may declare one tenant's scope the shared namespace (e.g. a public system prompt), which
regulated tenants never consult. Cached pages are owned by their tenant's cache namespace, with the
requests that matched them as readers. Under ``ENCRYPT`` an evicted page is sealed for its tenant,
not freed: the tenant's next hit reclaims (decrypts) it; a reclaim that answers "gone" is a miss and
the engine recomputes. Whole pages only. The Java side is ``dev.kvshield.bridge.prefix.PrefixCacheBridge``.
"""

import torch

from .errors import from_java

BACKEND_NAME = "kvshield"


class KvShieldPrefixCache:
    """Prefix cache over one kvshield allocator; called from the scheduler thread only."""

    def __init__(self, allocator, shared_tenant=None):
        import jpype

        self._jpype = jpype
        self.allocator = allocator
        self.page_size = allocator.page_size
        self._j = jpype.JClass("dev.kvshield.bridge.prefix.PrefixCacheBridge")(allocator._j)
        self._out = jpype.JArray(jpype.JInt)(int(allocator._j.pageCount()))
        if shared_tenant is not None:
            self._call(self._j.declareShared, allocator.tenant_id(shared_tenant))

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._jpype.JException as e:
            raise from_java(e) from None

    def _tokens(self, token_ids):
        return self._jpype.JArray(self._jpype.JInt)([int(t) for t in token_ids])

    def _slots(self, pages):
        p = torch.as_tensor(pages, dtype=torch.int64)
        return (p[:, None] * self.page_size + torch.arange(self.page_size)).reshape(-1)

    def match_prefix(self, rid, tenant, token_ids):
        """Slots (int64) of the longest cached whole-page prefix of ``token_ids`` in ``tenant``'s scope
        (or the shared one); the request reads those pages until :meth:`release`."""
        n = int(self._call(self._j.match, self.allocator.request_id(rid), self.allocator.tenant_id(tenant),
                           self._tokens(token_ids), self._out))
        return self._slots(list(self._out[:n]))

    def release(self, rid, tenant):
        """SGLang's ``dec_lock_ref`` for a request: it no longer reads its matched pages."""
        self._call(self._j.unmatch, self.allocator.request_id(rid), self.allocator.tenant_id(tenant))

    def cache_finished_req(self, rid, tenant, token_ids, slots):
        """Takes the finished request's full pages into its tenant's scope; returns pages newly cached.
        The tail page (partial) stays the request's to free."""
        full = len(token_ids) // self.page_size
        pages = torch.as_tensor(slots, dtype=torch.int64)[: full * self.page_size: self.page_size] // self.page_size
        return int(self._call(self._j.insert, self.allocator.request_id(rid), self.allocator.tenant_id(tenant),
                              self._tokens(token_ids[: full * self.page_size]),
                              self._jpype.JArray(self._jpype.JInt)(pages.tolist())))

    def evict(self, num_tokens):
        """Evicts least recently used unread pages covering ``num_tokens``; returns pages evicted."""
        return int(self._call(self._j.evict, -(-int(num_tokens) // self.page_size)))

    def stats(self):
        j = self._j
        return {"hits": int(j.hits()), "misses": int(j.misses()), "reclaim_hits": int(j.reclaimHits()),
                "reclaim_gone": int(j.reclaimGone()), "evictions": int(j.evictions()), "size": int(j.size()),
                "resident_pages": int(j.residentPages())}


def _factory(ctx):
    params = getattr(ctx, "params", None)
    allocator = getattr(params, "token_to_kv_pool_allocator", None)
    if allocator is None or not hasattr(allocator, "_j"):
        raise RuntimeError("radix-cache backend 'kvshield' needs kvshield's KV allocator (load the kvshield plug-in)")
    import os

    return KvShieldPrefixCache(allocator, os.environ.get("KVSHIELD_SHARED_PREFIX_TENANT") or None)


def register(registry=None):
    """Registers the backend in SGLang's radix-cache registry if it has one; returns whether it did."""
    if registry is None:
        try:
            from sglang.srt.mem_cache import registry
        except ImportError:
            return False
    if not hasattr(registry, "register_radix_cache_backend"):
        return False
    names = registry.registered_radix_cache_backends() if hasattr(registry, "registered_radix_cache_backends") else []
    if BACKEND_NAME not in names:
        registry.register_radix_cache_backend(BACKEND_NAME, _factory)
    return True
