"""The tenant-scoped, sealed prefix cache as an SGLang radix-cache backend (``--radix-cache-backend kvshield``).

:class:`KvShieldPrefixCache` is a drop-in ``BasePrefixCache``: it subclasses SGLang's own base and takes and
returns SGLang's parameter and result types (``MatchPrefixParams``/``MatchResult``, ``RadixKey`` with its
``extra_key``, ``cache_salt`` and ``limit``, ``EvictParams``/``EvictResult``, the lock results).

- **Tenant scope.** A request's tenant is the one the plug-in resolved server-side
  (``req.kvshield_tenant``, else the default tenant), never anything the client sends. Each tenant's
  pages hang under its own root children (keyed like SGLang's namespaces, by tenant, ``extra_key`` and
  ``cache_salt``); a lookup consults the operator's declared shared namespace only after a miss in
  its own scope, and never for a regulated tenant. A lookup that names no request matches nothing.
- **Pages host-side.** One tree node per whole page; its value is the page's slots as a device
  tensor built once from the host page id, and the page id stays on the node. Taking a request's
  pages (``cache_*_req``), releasing its duplicates and unaligned tail, lock changes and eviction
  are Java calls by page id (``dev.kvshield.bridge.prefix.PrefixCacheBridge``), so none of them
  reads a device tensor.
- **Locks are readers.** A request's lock on a node (``inc_lock_ref``) makes it a reader of every
  page on the path until the matching ``dec_lock_ref``; eviction takes only unlocked pages whose
  children are not resident, least recently used first.
- **Sealed eviction.** Cached pages are owned by their tenant's cache namespace. Under ``ENCRYPT`` an
  evicted page is sealed for its tenant and its node keeps the sealed reference: the tenant's next
  hit reclaims (decrypts) it; a reclaim that answers "gone" (the page went to another owner) drops
  the node and what hangs under it, and the engine recomputes. Under other levels an evicted page is
  scrubbed and its node dropped. A sealed node stays only while no node holds its page resident: a page
  the cache takes again drops the sealed node naming it, so the tree keeps at most one node per pool page.
- **Incremental LRU.** Evictable nodes (resident, unlocked, no resident child) wait in a heap by last
  access, queued as they become evictable or are touched; eviction pops it, never scanning the tree.
- **Whole pages only.** A request's partial tail page stays its own and goes back with its release.
"""

import contextvars
import heapq
import logging
from array import array
from contextlib import contextmanager

import torch
from sglang.srt.mem_cache.base_prefix_cache import (BasePrefixCache, DecLockRefResult, EvictResult, IncLockRefResult,
                                                    MatchResult)
from sglang.srt.mem_cache.radix_cache import RadixKey, TreeNode

from . import settings
from .engine_hooks import client_extra_key
from .errors import KvShieldError, from_java
from .tenants import TenantResolver, _check_name

BACKEND_NAME = "kvshield"
NO_HANDLE = 0  # PageHandles.NONE
LRU_SLACK = 64  # superseded heap entries tolerated beyond the resident pages before the heap is compacted

logger = logging.getLogger(__name__)


_UNLOCKING = contextvars.ContextVar("kvshield_unlocking", default=None)


@contextmanager
def unlocking(req):
    """Inside, SGLang releases request ``req``'s lock on its matched prefix (the decode side's
    ``_release_matched_prefix_lock``, which names only the node): :meth:`KvShieldPrefixCache.dec_lock_ref`
    releases that request's lock, not the latest one, which may be another live request's."""
    token = _UNLOCKING.set(req)
    try:
        yield
    finally:
        _UNLOCKING.reset(token)


def _namespace(key):
    """A key's namespace within a tenant: the client's ``extra_key`` (this tree scopes by tenant itself, so the shared
    namespace is reachable) and ``cache_salt`` (kept apart as SGLang does)."""
    return client_extra_key(key.extra_key), key.cache_salt


def _bigram_keys(params):
    """Whether SGLang keys this cache's pages by bigrams (EAGLE: the draft KV at a position is computed from the next
    token). The scheduler passes plain keys and flags EAGLE on ``CacheInitParams.is_eagle`` only."""
    return bool(getattr(params, "is_eagle", False))


def _pages_to_settle(protected_tokens, committed_tokens, cached_tokens, page_size):
    """``(from_page, full, end)`` of a finishing request's page list: from its first page past the protected prefix,
    through its full pages of ``cached_tokens``, to the page its ``committed_tokens`` end in; None when it commits
    nothing past the protected prefix (SGLang's ``strip_thinking_cache`` counts the prompt only, so a retracted
    reasoning request may end inside its own cached prefix): its pages past it are leftovers of its release."""
    from_page, end = protected_tokens // page_size, -(-committed_tokens // page_size)
    return (from_page, cached_tokens // page_size, end) if end > from_page else None


class KvShieldPrefixCache(BasePrefixCache):
    """SGLang's prefix cache over one kvshield allocator; called from the scheduler thread only."""

    def __init__(self, params, shared_tenant=None):
        allocator = params.token_to_kv_pool_allocator
        if allocator is None or not hasattr(allocator, "_j"):
            raise KvShieldError("radix-cache backend 'kvshield' needs kvshield's KV allocator (load the kvshield plug-in),"
                                f" got {type(allocator).__name__}")
        if getattr(params, "disable", False):
            raise KvShieldError("radix-cache backend 'kvshield' is a prefix cache; drop --disable-radix-cache or the"
                                " backend")
        if int(params.page_size) != int(allocator.page_size):
            raise KvShieldError(f"page_size {params.page_size} differs from the allocator's {allocator.page_size}")
        import jpype

        self._jpype = jpype
        self.disable = False
        self.req_to_token_pool = params.req_to_token_pool
        self.token_to_kv_pool_allocator = allocator
        self.page_size = int(allocator.page_size)
        self.device = allocator.device or "cpu"
        self._alloc = allocator
        self._bigram = _bigram_keys(params)
        self._resolver = TenantResolver.from_env()
        self._j = jpype.JClass("dev.kvshield.bridge.prefix.PrefixCacheBridge")(allocator._j)
        pages = int(allocator._j.pageCount())
        self._pages = jpype.JArray(jpype.JInt)(pages)
        self._take = jpype.JArray(jpype.JByte)(pages)
        self._refs = jpype.JArray(jpype.JLong)(pages)
        if shared_tenant is not None:
            self._call(self._j.declareShared, allocator.tenant_id(shared_tenant))
        self._clock = 0
        self._stats = dict.fromkeys(("hits", "misses", "reclaim_hits", "reclaim_gone", "evictions"), 0)
        self.root_node = None
        self.reset()

    # ------------------------------------------------------------ Java crossings

    def _call(self, fn, *args):
        # NOTE: after the deferred frees (call order). With this backend only frees outside the cache
        # (speculative over-allocation, retraction) are ever deferred, so there is rarely a wait.
        self._alloc.resolve_frees()
        try:
            return fn(*args)
        except self._jpype.JException as e:
            raise from_java(e) from None

    def _page_array(self, pages):
        self._pages[0:len(pages)] = pages
        return self._pages

    # ------------------------------------------------------------ tree

    def reset(self):
        """Drops every cached prefix; resident cache pages go back to the pool (SGLang's flush), protected at
        their tenants' levels. Every resident node's page is the cache's: one that is not raises (nothing
        evicted) rather than leaving a page no tree names."""
        if self.root_node is not None:
            self._evict_pages([n.kvshield_page for n in self._nodes() if n.value is not None])
        self.root_node = TreeNode()
        self.root_node.key = RadixKey(array("q"), None)
        self.root_node.value = []
        self.root_node.lock_ref = 1
        self.root_node.kvshield_resident_children = 0
        self._sealed = {}  # page -> the sealed node whose reference names it
        self._lru = []  # (last access, id, node) of evictable nodes; an entry counts while node.kvshield_queued is its time
        self.evictable_size_ = 0
        self.protected_size_ = 0
        self._resident_pages = 0

    def _subtree(self, node):
        """``node`` and every node under it."""
        stack = [node]
        while stack:
            n = stack.pop()
            yield n
            stack.extend(n.children.values())

    def _nodes(self):
        """Every node but the root."""
        return (n for n in self._subtree(self.root_node) if n is not self.root_node)

    def _evict_pages(self, pages):
        """Releases resident cache pages (sealed under ENCRYPT: their references land in ``_refs``)."""
        if pages:
            self._call(self._j.evict, self._page_array(pages), len(pages), self._refs)

    def _child_key(self, node, scope, namespace, block):
        return (scope, namespace, block) if node is self.root_node else block

    def _new_node(self, parent, child_key, scope, block, namespace, page):
        n = TreeNode()
        n.parent = parent
        n.key = RadixKey(array("q", block), namespace[0], cache_salt=namespace[1])
        n.kvshield_scope, n.kvshield_namespace, n.kvshield_block = scope, namespace, block
        n.kvshield_sealed_ref = NO_HANDLE
        n.kvshield_readers, n.kvshield_holders, n.kvshield_matcher = {}, [], None
        n.kvshield_resident_children, n.kvshield_queued = 0, None
        self._make_resident(n, page)
        parent.children[child_key] = n
        return n

    def _make_resident(self, node, page):
        if node.kvshield_sealed_ref != NO_HANDLE:
            del self._sealed[node.kvshield_page]
        node.parent.kvshield_resident_children += 1
        node.kvshield_page = page
        node.kvshield_sealed_ref = NO_HANDLE
        node.value = torch.arange(page * self.page_size, (page + 1) * self.page_size, dtype=torch.int64,
                                  device=self.device)
        node.last_access_time = self._tick()
        self.evictable_size_ += self.page_size
        self._resident_pages += 1

    def _tick(self):
        self._clock += 1
        return self._clock

    def _holder(self, req):
        """(tenant id, request id) of a request, the tenant from trusted server-side data only."""
        return self._alloc.tenant_id(self._resolver.resolve_request(req)), self._alloc.request_id(req)

    def _blocks(self, token_ids, count):
        ps = self.page_size
        return [tuple(token_ids[i * ps:(i + 1) * ps]) for i in range(count)]

    # ------------------------------------------------------------ match

    def match_prefix(self, params):
        """The longest cached whole-page prefix of ``params.key`` in the scope of ``params.req``'s tenant
        (or the shared one after a miss); sealed pages on the path are reclaimed. Nothing is locked."""
        req = getattr(params, "req", None)
        key = params.key
        token_ids = key.raw_token_ids()  # NOTE: honors the key's limit
        blocks = len(token_ids) // self.page_size
        # NOTE: EAGLE's bigram keys are not cached: a miss. A whole page matched on plain keys would hand over draft KV
        # its last position computed from the writer's next token, not the request's
        if req is None or blocks == 0 or key.is_bigram or self._bigram:
            return self._result([], self.root_node)
        tenant, rid = self._holder(req)
        path = self._walk(tenant, _namespace(key), token_ids, blocks)
        shared_hit = False
        if not path:
            shared = int(self._j.sharedScopeFor(tenant))
            if shared >= 0:
                path = self._walk(shared, _namespace(key), token_ids, blocks)
                shared_hit = bool(path)
        self._stats["hits" if path else "misses"] += 1
        last = path[-1] if path else self.root_node
        if path:
            last.kvshield_matcher = (tenant, rid)
        if shared_hit:  # NOTE: the shared tenant's pages, never the request's tenant's (tenants.foreign_prefix_pages)
            req.kvshield_shared_prefix = (last, len(path) * self.page_size)
        return self._result(path, last)

    def _result(self, path, last):
        if path:
            value = torch.cat([n.value for n in path])
        else:
            value = torch.empty((0,), dtype=torch.int64, device=self.device)
        return MatchResult(device_indices=value, last_device_node=last, last_host_node=last, best_match_node=last)

    def _walk(self, scope, namespace, token_ids, blocks):
        node, path = self.root_node, []
        for block in self._blocks(token_ids, blocks):
            child = node.children.get(self._child_key(node, scope, namespace, block))
            if child is None:
                break
            path.append(child)
            node = child
        sealed = [i for i, n in enumerate(path) if n.value is None]
        if sealed:
            refs = [path[i].kvshield_sealed_ref for i in sealed]
            self._refs[0:len(refs)] = refs
            self._call(self._j.reclaim, scope, self._refs, len(refs), self._pages)
            back = list(self._pages[0:len(refs)])
            for i, page in zip(sealed, back):
                if page >= 0:
                    self._make_resident(path[i], page)
                    self._stats["reclaim_hits"] += 1
            gone = [i for i, page in zip(sealed, back) if page < 0]
            self._stats["reclaim_gone"] += len(gone)
            if gone:
                self._drop(path[gone[0]])
                path = path[:gone[0]]
        now = self._tick()
        for n in path:
            n.last_access_time = now
            n.hit_count += 1
            self._queue(n)
        return path

    def _drop(self, node):
        """Removes sealed ``node`` and its subtree (unlocked, as nothing under a sealed node is); resident pages go
        back."""
        subtree = list(self._subtree(node))
        resident = [n for n in subtree if n.value is not None]
        self._evict_pages([n.kvshield_page for n in resident])
        self.evictable_size_ -= self.page_size * len(resident)
        self._resident_pages -= len(resident)
        for n in subtree:
            n.kvshield_queued = None
            if n.value is None and n.kvshield_sealed_ref != NO_HANDLE:
                del self._sealed[n.kvshield_page]
        del node.parent.children[self._child_key(node.parent, node.kvshield_scope, node.kvshield_namespace,
                                                  node.kvshield_block)]

    # ------------------------------------------------------------ locks

    def inc_lock_ref(self, node):
        """Locks the path to ``node`` for the request that matched it: that request reads its pages."""
        if node is self.root_node:
            return IncLockRefResult(delta=0)
        if node.kvshield_matcher is None:
            raise KvShieldError(f"inc_lock_ref of node {node.id}: no request matched it, so no reader can be named")
        return IncLockRefResult(delta=self._lock(node, node.kvshield_matcher))

    def dec_lock_ref(self, node, params=None):
        """Releases a lock on ``node``: the lock of the request SGLang releases it for where SGLang says which
        (:func:`unlocking`), else the latest (SGLang pairs each other dec with the inc just before it)."""
        if node is self.root_node:
            return DecLockRefResult(delta=0)
        if not node.kvshield_holders:
            raise KvShieldError(f"dec_lock_ref of node {node.id}, which holds no lock")
        req = _UNLOCKING.get()
        return DecLockRefResult(delta=self._unlock(node, node.kvshield_holders[-1] if req is None else self._holder(req)))

    def _path(self, node):
        path = []
        while node is not self.root_node:
            path.append(node)
            node = node.parent
        return path

    def _lock(self, node, holder):
        path = self._path(node)
        new = [n.kvshield_page for n in path if n.kvshield_readers.get(holder, 0) == 0]
        if new:  # NOTE: Java first, so a refused reader leaves the tree unchanged
            self._call(self._j.addReaders, node.kvshield_scope, holder[0], holder[1], self._page_array(new), len(new))
        delta = 0
        for n in path:
            if n.lock_ref == 0:
                self.evictable_size_ -= self.page_size
                self.protected_size_ += self.page_size
                delta -= self.page_size
            n.lock_ref += 1
            n.kvshield_readers[holder] = n.kvshield_readers.get(holder, 0) + 1
        node.kvshield_holders.append(holder)
        return delta

    def _unlock(self, node, holder):
        if holder not in node.kvshield_holders:
            raise KvShieldError(f"request {holder[1]} of tenant {holder[0]} holds no lock on node {node.id}")
        path = self._path(node)
        done = [n.kvshield_page for n in path if n.kvshield_readers.get(holder, 0) == 1]
        if done:
            self._call(self._j.removeReaders, node.kvshield_scope, holder[0], holder[1], self._page_array(done),
                       len(done))
        delta = 0
        for n in path:
            n.lock_ref -= 1
            if n.lock_ref == 0:
                self.evictable_size_ += self.page_size
                self.protected_size_ -= self.page_size
                delta += self.page_size
                self._queue(n)
            left = n.kvshield_readers[holder] - 1
            if left:
                n.kvshield_readers[holder] = left
            else:
                del n.kvshield_readers[holder]
        held = node.kvshield_holders
        del held[len(held) - 1 - held[::-1].index(holder)]
        return delta

    # ------------------------------------------------------------ requests' pages

    def _settle(self, req, tenant, rid, token_ids, from_page, to_page, release_to_page):
        """Takes the request's pages at ``[from_page, to_page)`` into its tenant's scope (a page whose block is
        cached resident is a duplicate and goes back), releases ``[to_page, release_to_page)``; returns the
        path of nodes for ``[0, to_page)``."""
        namespace = (client_extra_key(req.extra_key), req.cache_salt)
        node, path, plan = self.root_node, [], []
        for i, block in enumerate(self._blocks(token_ids, to_page)):
            ck = self._child_key(node, tenant, namespace, block) if node is not None else None
            child = node.children.get(ck) if node is not None else None
            if i < from_page:
                if child is None or child.value is None:
                    raise KvShieldError(f"request {req.rid}: its protected page {i} is not cached resident in its scope")
            else:
                plan.append((block, child is None or child.value is None))
            path.append(child)
            node = child
        n = len(plan)
        if n or release_to_page > to_page:
            self._take[0:n] = [1 if take else 0 for _, take in plan]
            self._call(self._j.settle, rid, tenant, from_page, to_page, release_to_page, self._take, self._pages)
        pages = list(self._pages[0:n])
        parent = path[from_page - 1] if from_page else self.root_node
        for k, ((block, take), page) in enumerate(zip(plan, pages)):
            i = from_page + k
            if take and page < 0:  # NOTE: SGLang freed this page inside the release (a stale free): none cached from here
                logger.warning("kvshield: request %s freed its page position %d inside its release; %d of its %d pages"
                               " cached, the rest go with its release", req.rid, i, i, to_page)
                del path[i:]
                break
            child = path[i]
            if child is None:
                child = self._new_node(parent, self._child_key(parent, tenant, namespace, block), tenant, block,
                                       namespace, page)
            elif take:
                self._make_resident(child, page)
            path[i] = child
            parent = child
        now = self._tick()
        for c in path:
            c.last_access_time = now
            self._queue(c)
        for c in path[from_page:]:  # NOTE: a page taken again ends the sealed reference an older eviction left on it
            stale = self._sealed.get(c.kvshield_page)
            if stale is not None:
                self._drop(stale)
        return path

    def cache_finished_req(self, req, is_insert=True, **kwargs):
        """A finished (or retracted, ``is_insert=False``) request: its full pages go to its tenant's scope
        (duplicates of cached pages and the unaligned tail go back), and its lock is released."""
        tenant, rid = self._holder(req)
        committed = kwargs.get("kv_len_to_handle")
        if committed is None:
            committed = req.effective_kv_committed_len()
        token_ids = (req.origin_input_ids + req.output_ids)[:committed]
        span = _pages_to_settle(req.cache_protected_len, committed, len(token_ids), self.page_size)
        last = self.root_node if req.last_node is None else req.last_node
        own_scope = last is self.root_node or last.kvshield_scope == tenant
        try:
            if span is not None and is_insert and own_scope and not self._bigram:
                self._settle(req, tenant, rid, token_ids, *span)
            elif span is not None:  # NOTE: pages under another scope's prefix (or EAGLE's, which no match reaches) are
                # never cached: none reads another's
                self._call(self._j.settle, rid, tenant, span[0], span[0], span[2], self._take, self._pages)
        except BaseException:
            self._alloc.tree_call_failed()  # NOTE: this tree names only its namespace's pages: the request's still go back
            raise
        finally:
            if last is not self.root_node:
                self._unlock(last, (tenant, rid))

    def cache_unfinished_req(self, req, chunked=False, **kwargs):
        """A request between chunks: its full pages so far go to its tenant's scope, its row points at the
        cached pages, and its lock moves to the new last node. The partial page stays its own."""
        tenant, rid = self._holder(req)
        token_ids = req.get_fill_ids()
        ps = self.page_size
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx, :len(token_ids)]
        last = self.root_node if req.last_node is None else req.last_node
        if self._bigram or (last is not self.root_node and last.kvshield_scope != tenant):
            req.prefix_indices = row  # its own pages stay its own under the shared prefix (or EAGLE's: never matched)
            return
        path = self._settle(req, tenant, rid, token_ids, req.cache_protected_len // ps, len(token_ids) // ps,
                            len(token_ids) // ps)
        new_last = path[-1] if path else self.root_node
        new_indices = self._result(path, new_last).device_indices
        if len(new_indices) > req.cache_protected_len:
            self.req_to_token_pool.write((req.req_pool_idx, slice(req.cache_protected_len, len(new_indices))),
                                         new_indices[req.cache_protected_len:])
        req.cache_protected_len = len(new_indices)
        if new_last is not self.root_node:
            self._lock(new_last, (tenant, rid))
        if last is not self.root_node:
            self._unlock(last, (tenant, rid))
        req.prefix_indices = torch.cat([new_indices, row[len(new_indices):]]) if len(new_indices) < len(row) \
            else new_indices
        req.last_node = new_last

    # ------------------------------------------------------------ eviction and sizes

    def evict(self, params):
        """Evicts least recently used unlocked pages whose children are not resident, covering
        ``params.num_tokens``: sealed for their tenant under ENCRYPT (reclaimable), scrubbed otherwise."""
        want = -(-int(params.num_tokens) // self.page_size)
        chosen, freed = [], {}  # freed: node -> its resident children chosen in this round
        while len(chosen) < want:
            n = self._pop_evictable(freed)
            if n is None:
                break
            chosen.append(n)
            p = n.parent
            if p is not self.root_node:
                freed[p] = freed.get(p, 0) + 1
                self._queue(p, freed[p])
        if not chosen:
            return EvictResult(num_tokens_evicted=0)
        try:
            self._evict_pages([n.kvshield_page for n in chosen])
        except BaseException:
            for n in chosen:  # nothing evicted: back in the queue
                self._queue(n)
            raise
        refs = list(self._refs[0:len(chosen)])
        for n, ref in zip(chosen, refs):
            n.value = None
            n.kvshield_sealed_ref = ref
            n.parent.kvshield_resident_children -= 1
            self.evictable_size_ -= self.page_size
            self._resident_pages -= 1
            if ref != NO_HANDLE:
                self._sealed[n.kvshield_page] = n
        for n, ref in zip(chosen, refs):
            if ref == NO_HANDLE:
                self._drop(n)
        self._stats["evictions"] += len(chosen)
        return EvictResult(num_tokens_evicted=len(chosen) * self.page_size)

    def _queue(self, node, freed=0):
        """Queues ``node`` for eviction when it is evictable (``freed`` of its resident children chosen already)
        and not queued at its last access; an older entry of it no longer counts."""
        if node.kvshield_queued != node.last_access_time and self._evictable(node, freed):
            if len(self._lru) > 2 * self._resident_pages + LRU_SLACK:
                self._lru = [e for e in self._lru if e[2].kvshield_queued == e[0]]
                heapq.heapify(self._lru)
            heapq.heappush(self._lru, (node.last_access_time, node.id, node))
            node.kvshield_queued = node.last_access_time

    def _pop_evictable(self, freed):
        """The least recently used queued node still evictable, taken out of the queue; None when there is none."""
        while self._lru:
            time, _, n = heapq.heappop(self._lru)
            if n.kvshield_queued == time:
                n.kvshield_queued = None
                if self._evictable(n, freed.get(n, 0)):
                    return n
        return None

    @staticmethod
    def _evictable(node, freed):
        return node.value is not None and node.lock_ref == 0 and node.kvshield_resident_children == freed

    def evictable_size(self):
        return self.evictable_size_

    def protected_size(self):
        return self.protected_size_

    def total_size(self):
        """Tokens of resident cached pages."""
        return self._resident_pages * self.page_size

    def pretty_print(self):
        stack = [(self.root_node, 0)]
        while stack:
            n, indent = stack.pop()
            state = "root" if n is self.root_node else (
                f"page={n.kvshield_page}" if n.value is not None else "sealed")
            print(" " * indent, len(n.key), n.key.token_ids[:10], f"r={n.lock_ref}", state)
            stack.extend((c, indent + 2) for c in n.children.values())
        print(f"#tokens: {self.total_size()}")

    def stats(self):
        """Lookups that hit/missed, sealed pages reclaimed/found gone, pages evicted, resident and sealed pages."""
        return {**self._stats, "resident_pages": self._resident_pages, "sealed_pages": len(self._sealed)}


def _factory(ctx):
    shared = settings.get("KVSHIELD_SHARED_PREFIX_TENANT")
    if shared is not None:
        _check_name(shared, "KVSHIELD_SHARED_PREFIX_TENANT")
    return KvShieldPrefixCache(ctx.params, shared)


def register():
    """Registers the backend in SGLang's radix-cache registry (raises HookError when this SGLang has none)."""
    from . import hooks

    module = "sglang.srt.mem_cache.registry"
    add = hooks.expect(hooks.lookup(module, "register_radix_cache_backend"), f"{module}.register_radix_cache_backend",
                       ("name", "factory"))
    if BACKEND_NAME not in hooks.lookup(module, "registered_radix_cache_backends")():
        add(BACKEND_NAME, _factory)
