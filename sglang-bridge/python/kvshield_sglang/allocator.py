"""SGLang's token and paged KV allocators on kvshield.

``TokenToKVPoolAllocator`` (``page_size == 1``) and ``PagedTokenToKVPoolAllocator`` subclass SGLang's own
classes and keep their contract exactly (constructor, ``alloc``/``free``/``free_segment``/
``available_size``/free groups/``alloc_extend``/``alloc_decode``, ``free_pages``/``release_pages`` as
page-id tensors, ``get_cpu_copy``/``load_cpu_copy``, ``resize``, slot 0 reserved); both share
:class:`_KvShieldMixin`, which overrides the primitives.

Each call is one JVM crossing: slots travel through two shared buffers (``io``, ``plan``) that
Java reads in place; the step boundary rides on the step's first crossing.

Page ids travel host-side: the plan comes from SGLang's ``*_cpu`` arguments, an extension's
``last_loc`` and a request's ``free_segment`` are answered from Java's per-request page lists, so
these paths copy nothing from the device. A free of device indices that nothing host-side names
(radix-cache eviction, duplicate prefixes, the token allocator's ``free``) is deferred: its slots
travel to a pinned host buffer by a non-blocking copy and reach the pool at the next deterministic
point (:meth:`_KvShieldMixin.resolve_frees`). The only blocking device->host copy left is an
unattributed extension of a partial page (counted in :meth:`_KvShieldMixin.host_syncs`).
"""

import atexit
import ctypes
import functools
import itertools
import logging
import os
import struct
import weakref
from contextlib import contextmanager

import torch
from sglang.srt.mem_cache.allocator.base import BaseTokenToKVPoolAllocator as _UpstreamBase
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator as _UpstreamPaged
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator as _UpstreamToken
from sglang.srt.utils import get_bool_env_var

from . import buffers, coverage, hooks, launch_fence, ranks, runtime, settings as env_settings
from .errors import KvShieldError, RejectedFreeError, UnsupportedFeatureError, from_java

logger = logging.getLogger(__name__)

PLAN_ROW = 5
_PLAN_ROW_PACK = struct.Struct(f"={PLAN_ROW}q").pack_into  # one plan row into the plan buffer's bytes
STEP_BOUNDARY = 1
IN_FREE_GROUP = 2  # Java's SlotAllocator.IN_FREE_GROUP: the freed pages stay held until free_group_end
CACHE_EVICTION = 4  # Java's SlotAllocator.CACHE_EVICTION: a free outside a request presents the tree cache's holds
_INT_DTYPES = (torch.int64, torch.int32)
# Page states as Java's SlotAllocator.pagesIn selects them (bit = PageState ordinal).
_FREE_STATES = (1 << 0) | (1 << 1)  # FREE, SEALED: handed out next
_RELEASED_STATES = 1 << 3  # QUARANTINED: released, reusable after protection at the next step boundary
_OWNED_STATES = 1 << 2
# An allocator built without KV memory (``kvcache=None``, as some of SGLang's own unit tests build one)
# keeps its pages in the pool's own off-heap bytes: one layer of one byte per token.
_INDEX_ONLY_LAYOUT = {"kinds": ["LATENT"], "labels": ["index-only"], "bytes_per_token": [1], "addresses": [0],
                      "byte_sizes": [0], "device_index": -1, "device_type": "cpu", "accepted_gaps": []}

# Settings from the environment (constructor keyword ``kvshield_settings`` overrides).
_ENV = {
    "level": "KVSHIELD_LEVEL",
    "strict": "KVSHIELD_STRICT",
    "quarantine": "KVSHIELD_QUARANTINE",
    "releaseLagSteps": "KVSHIELD_RELEASE_LAG_STEPS",
    "defaultTenant": "KVSHIELD_DEFAULT_TENANT",
    "backend": "KVSHIELD_BACKEND",
    "sealerFactory": "KVSHIELD_SEALER_FACTORY",
    "headroomFraction": "KVSHIELD_HEADROOM_FRACTION",
    "strictAdmission": "KVSHIELD_STRICT_ADMISSION",
    "advertisedContextTokens": "KVSHIELD_ADVERTISED_CONTEXT_TOKENS",
    "rootKey": "KVSHIELD_ROOT_KEY",
    "metricsBasePort": "KVSHIELD_METRICS_BASE_PORT",
    "auditSigningKey": "KVSHIELD_AUDIT_SIGNING_KEY",
    "auditDir": "KVSHIELD_AUDIT_DIR",
    "auditShip": "KVSHIELD_AUDIT_SHIP",
    "auditCheckpointSeconds": "KVSHIELD_AUDIT_CHECKPOINT_SECONDS",
}


def check_backend(backend):
    """Refuses a backend that keeps the pool's pages in memory of its own (``cpu-offheap``: simulations): over SGLang's
    KV buffers nothing the engine reads would ever be scrubbed or sealed, while the rank reported itself protected."""
    if backend == "cpu-offheap":
        raise UnsupportedFeatureError("KVSHIELD_BACKEND cpu-offheap keeps the pool's pages in memory of its own, never in"
                                      " SGLang's KV buffers: nothing of their KV would be scrubbed or sealed; leave it unset"
                                      " (cpu-external for CPU tensors, cuda for CUDA ones)")


def settings_from_env(overrides=None):
    # NOTE: a variable set but empty is refused (Java refuses the root key's without showing it), never read as unset
    s = {k: os.environ[e] if k == "rootKey" else env_settings.get(e) for k, e in _ENV.items() if e in os.environ}
    s.update({k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in (overrides or {}).items()})
    return s


class _KvShieldMixin:
    """The kvshield primitives, shared by the token and the paged allocator."""

    def _kvshield_init(self, size, page_size, dtype, device, kvcache, need_sort, kvshield_settings, server_args=None,
                       extra_kvcaches=()):
        _UpstreamBase.__init__(self, size, page_size, dtype, device, kvcache, need_sort)
        if int(page_size) < 1:
            raise ValueError(f"page_size must be at least 1: page_size={page_size}")
        if size % page_size:
            raise ValueError(f"size {size} is not a multiple of page_size {page_size}")
        settings = dict(kvshield_settings or {})
        accept = buffers.accepted_gaps(settings)
        settings.pop("accept_gaps", None)
        self._accepted_gaps = accept
        building = coverage.building()  # SGLang's configurator hands over its server args there
        if server_args is None and building is not None:
            server_args = building.server_args
        self._server_gaps = buffers.check_server_args(server_args, accept)
        props = settings_from_env(settings)
        if "advertisedContextTokens" not in props:
            ctx = _sglang_context_length(server_args)
            if ctx:
                props["advertisedContextTokens"] = str(ctx)
        identity = hooks.rank_identity()
        props.setdefault("rank", str(identity[0]))
        props.setdefault("poolId", "sglang-" + ranks.rank_name(*identity))
        self._pool_id = props["poolId"]
        # NOTE: no KV memory (kvcache=None): page ids are guarded on the pool's own bytes; the rank reports
        # itself unprotected, so a server never serves on such an allocator.
        self._no_kv_memory = kvcache is None
        if self._no_kv_memory:
            props["backend"] = "cpu-offheap"
        else:
            check_backend(props.get("backend"))
        self._kvcaches = [k for k in [kvcache, *extra_kvcaches] if k is not None]
        self._props = props
        self._launch_fence = None
        self._sealed = False
        runtime.ensure_jvm()
        import jpype

        self._jpype = jpype
        layout = _INDEX_ONLY_LAYOUT if self._no_kv_memory else buffers.describe(self._kvcaches, size, page_size, accept)
        self._open(layout, size)
        self._plan = torch.zeros(PLAN_ROW * 256, dtype=torch.int64)
        self._bind()
        self._flags = 0
        self._plan_rows = 0
        self._releasing_tenant = -1
        self._releasing_request = -1
        self._evicting = False
        self._host_syncs = 0
        # A request's host free waiting in io for its release's end (see releasing), or None.
        self._held = None
        # Deferred pool operations, in call order (see _defer): each a tuple whose first item names it.
        self._pending = []
        self._pending_tokens = 0
        self._group_tokens = 0  # deferred frees' tokens inside SGLang's open free group
        # Frees that reached the pool's deferred list (a release's or a free group's) before their end, now
        # queued behind deferred operations: whether any may be there, and the tokens of theirs counted.
        self._listed = False
        self._listed_tokens = 0
        self._pending_pages_of = {}  # request id -> pages its queued frees and tree-kept slots name
        self._leftovers_counted = set()  # requests whose queued leftovers available_size() counts already
        # Whose holds the queued operations present: request ids, and whether the unattributed ones (see _hand_out_after)
        self._pending_holders = set()
        self._pending_unattributed = False
        self._session_kept = set()  # releasing request ids whose KV a streaming session's slot keeps (no leftovers)
        self._failed_naming_no_holds = -1  # the releasing request whose tree call raised naming none of its holds
        # Audit trail only: ends to record at the next step boundary, and released requests not yet known ended.
        self._ends = []
        self._released = {}
        self._staged_slots = 0
        self._staging = None
        self._spare_events = []
        # NOTE: one id per request object (never the client's rid: two live requests may share one),
        # never reused. Keyed by the object's identity, each entry with a weak reference whose callback drops
        # it when the request goes (a WeakKeyDictionary's Python-level lookups cost a microsecond each).
        self._request_ids = {}
        self._named_request_ids = {}
        self._next_request_id = 0
        self.strict = bool(self._jalloc.strict())
        # SGLang's own debug switch: a free the pool rejects then raises as an assertion, as upstream's checks do.
        self.debug_mode = get_bool_env_var("SGLANG_DEBUG_MEMORY_POOL")

    def _open(self, layout, size):
        """Opens the Java allocator over ``size`` tokens of ``layout`` (:func:`buffers.describe`; the
        buffers may hold more rows) and sets the rank detail."""
        jpype, props = self._jpype, self._props
        stream_handle, event_handles = 0, []
        if layout["device_type"] != "cpu":
            props.setdefault("backend", "cuda")
            if self._launch_fence is None:
                self._launch_fence = launch_fence.LaunchFence(layout["device_index"])
            stream_handle, event_handles = self._launch_fence.stream_handle, self._launch_fence.event_handles
        # NOTE: each Java pool this process opens gets its own id (a reopen for a draft pool or a resize, SWA's
        # second allocator of a rank), so its audit trail is a new one, never appended to another's
        opened = next(_POOLS_OPENED)
        props["poolId"] = self._pool_id if opened == 1 else f"{self._pool_id}-open{opened}"
        jmap = jpype.JClass("java.util.HashMap")()
        for k, v in props.items():
            jmap.put(k, v)
        self._jalloc = None
        try:
            self._jalloc = jpype.JClass("dev.kvshield.bridge.SlotAllocator").open(
                jmap, self.page_size, size // self.page_size + 1, layout["kinds"], layout["labels"],
                layout["bytes_per_token"], jpype.JArray(jpype.JLong)(layout["addresses"]),
                jpype.JArray(jpype.JLong)(layout["byte_sizes"]), layout["device_index"], stream_handle,
                jpype.JArray(jpype.JLong)(event_handles))
        except jpype.JException as e:
            raise from_java(e) from None
        self._layout = layout
        self._audited = self._jalloc.auditTrail() is not None
        if self._audited:  # NOTE: the trail's final signed checkpoint is written at close; SGLang never closes us
            atexit.register(_close_at_exit, weakref.ref(self), self._jalloc)
        # NOTE: tenant ids are the open pool's: a reopened pool (resize) registers names afresh, so an id
        # cached from the closed one could name another tenant there
        self._tenant_ids = {}
        self._slot_count = (size // self.page_size + 1) * self.page_size
        self._page_ids = jpype.JArray(jpype.JInt)(size // self.page_size + 1)
        # NOTE: io holds every slot of the pool so any free fits; plan grows on demand.
        self._io = torch.zeros(self._slot_count, dtype=torch.int64)
        self._set_rank_detail()

    def _set_rank_detail(self):
        """The rank's record (see :mod:`ranks`): level, backend, pools, buffers and every accepted gap."""
        gaps = sorted(set(self._server_gaps) | set(self._layout["accepted_gaps"]))
        pools = "+".join(type(k).__qualname__ for k in self._kvcaches) or "none"
        self.kvshield_accepted_gaps = gaps
        self.kvshield_rank_detail = (f"{type(self).__name__} level={self._props.get('level', 'ZERO')}"
                                     f" backend={self._props.get('backend', 'cpu-external')} pools={pools}"
                                     f" buffers={len(self._layout['kinds'])} accepted-gaps={','.join(gaps) or 'none'}")

    def kvshield_note_accepted_gap(self, gap):
        """Records an accepted gap found after start-up (SGLang's retraction backend) on the rank's record."""
        if gap not in self._server_gaps:
            self._server_gaps = sorted(set(self._server_gaps) | {gap})
            self._set_rank_detail()
            _report_active(self)

    @property
    def _j(self):
        """The Java allocator. Any use of it from outside start-up seals the set of registered KV
        pools (:meth:`kvshield_register_kvcache` refuses from then on). Raises when a reopen failed and
        left no pool (never a closed one)."""
        self._sealed = True
        if self._jalloc is None:
            raise KvShieldError(f"{type(self).__name__} has no open pool: reopening it failed (see the error raised then)")
        if self._held is not None:
            self._run_held()
        return self._jalloc

    def kvshield_kvcaches(self):
        """The KV pools whose buffers this allocator protects: its own, then the draft pools registered."""
        return list(self._kvcaches)

    def kvshield_register_kvcache(self, kvcache):
        """Protects another KV pool that shares this allocator's token slots (SGLang's draft worker
        builds its pool after the target's allocator): every buffer of every registered pool is
        scrubbed or sealed on release. Only before the allocator's first use (the Java pool is
        reopened over the longer buffer list); afterwards, or for a pool kvshield does not cover,
        it raises and the allocator is unchanged."""
        if any(k is kvcache for k in self._kvcaches):
            return
        layout = self.kvshield_check_kvcache(kvcache)
        pools = self._kvcaches + [kvcache]
        old_layout = self._layout
        self._jalloc.close()
        try:
            self._kvcaches = pools
            self._open(layout, self.size)
        except BaseException:
            self._kvcaches = pools[:-1]
            self._open(old_layout, self.size)
            raise
        self._bind()
        _report_active(self)

    def kvshield_check_kvcache(self, kvcache):
        """Raises as :meth:`kvshield_register_kvcache` would for ``kvcache`` (too late, or not covered), changing
        nothing; returns the layout it would open."""
        if self._sealed or self._no_kv_memory:
            raise UnsupportedFeatureError(
                f"KV pool {type(kvcache).__qualname__} was registered with {type(self).__name__} after the allocator"
                " started serving (or on one without KV memory); its pages would not be protected. Every KV pool"
                " sharing an allocator must be built before the first allocation")
        return buffers.describe(self._kvcaches + [kvcache], self.size, self.page_size, self._accepted_gaps)

    def _bind(self):
        nio = self._jpype.nio
        # NOTE: numpy views of the shared buffers: element writes and slice copies there cost a fraction of torch's
        self._io_np = self._io.numpy()
        self._io_addr = self._io_np.ctypes.data
        self._plan_np = self._plan.numpy()
        self._plan_bytes = memoryview(self._plan_np).cast("B")
        self._jalloc.bind(nio.convertToDirectBuffer(memoryview(self._io_np).cast("B")),
                          nio.convertToDirectBuffer(memoryview(self._plan_np).cast("B")))

    # ------------------------------------------------------------ SGLang attributes

    @property
    def free_pages(self):
        """SGLang's free list as a page-id tensor (read by metrics and invariant checks; built on each read,
        one crossing): the pages handed out next and the released pages waiting for their step boundary,
        the latter where SGLang lists its newly freed ones (first for the paged allocator, last for the
        token allocator; with ``need_sort`` in :attr:`release_pages` instead). Read-only: the free list
        lives in the pool."""
        pages = self._pages_in(_FREE_STATES)
        if self.need_sort:
            return pages
        released = self._pages_in(_RELEASED_STATES)
        return torch.cat((released, pages) if self._released_listed_first else (pages, released))

    @free_pages.setter
    def free_pages(self, value):
        if value is not None:  # NOTE: SGLang's base __init__ assigns None
            raise AttributeError("free_pages of a kvshield allocator is read-only (the free list lives in the pool)")

    @property
    def release_pages(self):
        """With ``need_sort`` (disaggregation), the released pages waiting for their step boundary; else empty."""
        if not self.need_sort:
            return torch.empty((0,), dtype=torch.int64)
        return self._pages_in(_RELEASED_STATES)

    @release_pages.setter
    def release_pages(self, value):
        if value is not None:
            raise AttributeError("release_pages of a kvshield allocator is read-only (the free list lives in the pool)")

    def _pages_in(self, states):
        self.resolve_frees()
        n = int(self._call(self._j.pagesIn, states, self._page_ids))
        return torch.tensor(self._page_ids[0:n], dtype=torch.int64)

    # ------------------------------------------------------------ steps, plans, tenants

    def begin_step(self):
        """Marks a scheduler step boundary; it runs on the step's first crossing (one crossing per step).
        The previous step's deferred frees reach the pool first (:meth:`resolve_frees`); the boundary
        is marked even when one of them raises."""
        try:
            self._finish_step()
        finally:
            if self._flags & STEP_BOUNDARY:
                self._call(self._j.endStep)
            self._flags |= STEP_BOUNDARY

    def end_step(self):
        """Runs a step boundary now (tests, idle loops), after the deferred frees (:meth:`resolve_frees`),
        even when one of them raises."""
        try:
            self._finish_step()
        finally:
            self._flags &= ~STEP_BOUNDARY
            steps = int(self._call(self._j.endStep))
        return steps

    def _finish_step(self):
        """What reaches the pool before a step boundary, in order: the step's deferred frees, then the ends of the
        requests they finished (:meth:`_record_ends`), the latter even when one of the frees raises."""
        try:
            self.resolve_frees()
        finally:
            self._record_ends()

    def _take_flags(self):
        f = self._flags
        self._flags = 0
        return f

    def tenant_id(self, name):
        tid = self._tenant_ids.get(name)
        if tid is None:
            tid = int(self._call(self._j.tenantId, name))
            self._tenant_ids[name] = tid
        return tid

    def request_id(self, req):
        """The pool's id of a request: one per SGLang ``Req`` object, minted on first sight and never
        reused (the client's ``rid`` is not an identity: two live requests may carry the same one).
        A string names a request outside SGLang's scheduler (tests, tools) and maps to one id."""
        if isinstance(req, str):
            rid_int = self._named_request_ids.get(req)
            if rid_int is None:
                rid_int = self._named_request_ids[req] = self._mint_request_id()
            return rid_int
        key = id(req)
        entry = self._request_ids.get(key)
        if entry is not None and entry[0]() is req:  # NOTE: a dead entry's id may be a new object's now
            return entry[1]
        rid_int = self._mint_request_id()
        self._request_ids[key] = (weakref.ref(req, functools.partial(_forget_request, self._request_ids, key)), rid_int)
        return rid_int

    def _known_request_id(self, req):
        """The pool's id of ``req`` if it has one (never mints one), else None."""
        if isinstance(req, str):
            return self._named_request_ids.get(req)
        entry = self._request_ids.get(id(req))
        return entry[1] if entry is not None and entry[0]() is req else None

    def request_finished(self, req, tenant, aborted, label):
        """Records in the pool's audit trail, when one is attached, that ``req`` (a request, or a streaming session:
        the holder its turns serve as) of ``tenant`` ended (``aborted``: SGLang aborted it), named by ``label``
        (control characters escaped, at most 256 characters; none when empty), so an operator finds the request a
        trail names. Recorded at the next step boundary, after the deferred operations of this step (its own
        release's among them: the summary counts what they did). Nothing for a request the pool never knew."""
        rid_int = self._known_request_id(req) if self._audited else None
        if rid_int is not None:
            self._ends.append((self.tenant_id(tenant), rid_int, bool(aborted), _label(label)))

    def request_released(self, req, tenant, outcome):
        """SGLang released ``req``'s KV: when an audit trail is attached, its end is recorded at the next step
        boundary (:meth:`request_finished`, its ``rid`` as label) if by then ``outcome(req)`` says it ended (True:
        aborted, False: completed; None: it runs again, a retraction or a requeue, and a later release decides),
        or if SGLang dropped it without a finish (aborted). SGLang marks some requests finished only after their
        release (a prefill whose transfer failed is aborted after it)."""
        rid_int = self._known_request_id(req) if self._audited else None
        if rid_int is not None:
            self._released[rid_int] = (weakref.ref(req), self.tenant_id(tenant), _label(getattr(req, "rid", None)),
                                       outcome)

    def _record_ends(self):
        """Writes the ends of requests due (see :meth:`request_released`) to the trail, in order."""
        for rid_int, (ref, tenant, label, outcome) in list(self._released.items()):
            req = ref()
            aborted = True if req is None else outcome(req)
            if aborted is not None:
                del self._released[rid_int]
                self._ends.append((tenant, rid_int, aborted, label))
        ends, self._ends = self._ends, []
        for tenant, rid_int, aborted, label in ends:
            self._call(self._j.requestFinished, tenant, rid_int, aborted, label)

    def serve_as(self, req, holder):
        """Request ``req`` is a turn of ``holder`` (SGLang's streaming ``Session``): from now on the pool knows it
        by the holder's id (:meth:`request_id`), so its allocations, frees and extensions are the holder's and the
        KV the holder keeps between turns is this turn's to read and extend. Raises, changing nothing, when
        ``req`` already holds pages under an id of its own (they would be stranded under it)."""
        rid_int = self.request_id(holder)
        key = id(req)
        entry = self._request_ids.get(key)
        if entry is not None and entry[0]() is req:
            if entry[1] == rid_int:
                return
            held = int(self._call(self._j.heldPages, entry[1]))
            if held:
                raise KvShieldError(f"request {req.rid!r} (pool id {entry[1]}) holds {held} page(s) of its own and"
                                    f" cannot become a turn of pool holder {rid_int}: those pages would be stranded")
        self._request_ids[key] = (weakref.ref(req, functools.partial(_forget_request, self._request_ids, key)), rid_int)

    def session_kept(self, req, holder):
        """SGLang's streaming session kept the KV of ``req`` (a turn of ``holder``, :meth:`serve_as`) in its slot
        at the turn's release: the pages stay the holder's, so the release ends without releasing leftovers, and
        ``req`` stops being the holder's turn (a later operation naming the finished ``Req`` presents holds of its
        own, none). Raises when ``req`` is not the holder's turn: its pages were never the holder's."""
        rid_int = self.request_id(holder)
        if self.request_id(req) != rid_int:
            raise KvShieldError(f"streaming session request {req.rid!r} finished as no turn of its session (pool id"
                                f" {rid_int}): its KV is not the session's to keep")
        if self._releasing_request == rid_int:
            self._session_kept.add(rid_int)
        self.leave_session(req, holder)

    def leave_session(self, req, holder):
        """Request ``req`` no longer serves as ``holder`` (its turn ended, or SGLang detached it from the session):
        operations naming it from now on present holds of its own. Nothing changes if it did not serve as it."""
        entry = self._request_ids.get(id(req))
        if entry is not None and entry[0]() is req and entry[1] == self.request_id(holder):
            del self._request_ids[id(req)]

    def _mint_request_id(self):
        rid_int = self._next_request_id
        self._next_request_id += 1
        return rid_int

    def set_plan(self, rows):
        """The step's host-side plan: one (request, tenant name, prefix_len, seq_len) per request, in
        batch order (a request is its ``Req`` object, see :meth:`request_id`). Pages allocated next
        are held by these requests and ``[prefix, seq)`` is recorded as written."""
        request_id, tenant_id = self.request_id, self.tenant_id
        # NOTE: looked up before the buffer grows: a row that raises leaves the plan (and its buffer) unchanged
        values = [(request_id(r), tenant_id(t), int(p), int(s)) for r, t, p, s in rows]
        n = len(values)
        self._plan_room(n)
        buf = self._plan_bytes
        self._plan_rows = 0  # NOTE: a value outside int64 stops the packing midway: then no plan, never a half-written one
        for i, (r, t, p, s) in enumerate(values):
            _PLAN_ROW_PACK(buf, 8 * PLAN_ROW * i, r, t, p, s, -1)  # NOTE: a numpy or array copy costs several times more
        self._plan_rows = n

    def _plan_room(self, rows):
        """Grows the plan buffer (rebound to Java) to hold ``rows`` rows, at least doubling it; its rows are not kept."""
        if PLAN_ROW * rows > self._plan.numel():
            self._plan = torch.zeros(PLAN_ROW * max(rows, 2 * self._plan.numel() // PLAN_ROW), dtype=torch.int64)
            self._bind()

    def clear_plan(self):
        self._plan_rows = 0

    def releasing(self, tenant, req, leftovers=False):
        """Frees inside come from request ``req`` of ``tenant`` (SGLang's release of a request, and its
        tree cache's work on it): they free the request's own holds only; a slot it does not hold
        (another request's, the cache's, another tenant's, already freed) is refused. ``free_segment``
        of the request's row names its pages from the request's page list instead of reading the
        device. The frees stay deferred frees until the context ends (or SGLang's free group, when
        one is open), so a page the tree cache keeps in between (:meth:`tree_kept`) is withdrawn
        from them instead of being released under the tree. With ``leftovers``, a context that ends
        without an exception then runs :meth:`release_leftovers` for the request; one that ends with an
        exception too when the exception is a tree call's that named none of the request's holds
        (:meth:`tree_call_failed`), and the exception goes on.

        A release whose only pool operation is one host free (the usual one, with no tree cache
        keeping pages) costs one crossing, at the end: the free waits in ``io`` (:meth:`_run_held`)
        and goes with the release's end in one call of the same checks and outcome. A refusal or a
        slot outside the pool is then reported at the context's end instead of at the free."""
        return _Releasing(self, tenant, req, leftovers)

    def tree_call_failed(self):
        """The tree cache's call on the request being released raised, and its tree names none of the request's holds
        (kvshield's backend names only its namespace's pages): the release's leftovers still go back when it ends with
        the exception. After any other exception they stay the request's, as a stock tree (or a streaming session's
        slot) may name slots the request still holds, inserted and not yet adopted (:meth:`tree_kept`)."""
        self._failed_naming_no_holds = self._releasing_request

    def tree_kept(self, slots):
        """SGLang's tree cache kept ``slots`` (a device or host index tensor: the part of an insert's value
        it did not hold already): their pages become the cache's holds, taken from the request being
        released (or, outside a release, from the unattributed pages); a page that request freed
        earlier in its release is withdrawn from that free. In call order, like a free."""
        n = self._slot_tensor("tree_kept", slots)
        if n == 0:
            return
        request = self._releasing_request
        tenant = self._releasing_tenant if request >= 0 else int(self._j.defaultTenant())
        op = ("adopt_slots", n, tenant, request, 0)
        if slots.device.type != "cpu" or self._pending:
            self._defer(op, slots)
            return
        if self._held is not None:
            self._run_held()
        self._host_slots_to_io(slots, n)
        self._run(op)

    @contextmanager
    def evicting(self):
        """Frees inside (outside any request's release) are SGLang's tree cache evicting: they present
        the cache's holds (pages it took, :meth:`cache_took`). Any other free outside a request's
        release presents only unattributed holds, so a stale free of slots the cache holds is refused."""
        prev = self._evicting, self._releasing_tenant, self._releasing_request
        # NOTE: a tree evicting inside a request's release frees the cache's holds, not the request's
        self._evicting, self._releasing_tenant, self._releasing_request = True, -1, -1
        try:
            yield
        finally:
            self._evicting, self._releasing_tenant, self._releasing_request = prev

    def cache_took(self, req, tenant, to_pos=-1):
        """SGLang's tree cache took request ``req``'s pages at token positions ``[0, to_pos)`` (-1: every
        page it still holds): they become the cache's holds, freed from now on only by frees outside a
        request's release (the tree's eviction). In call order behind the deferred frees."""
        to_page = -1 if to_pos < 0 else int(to_pos) // self.page_size
        self._run_or_defer(("adopt", self.request_id(req), self.tenant_id(tenant), to_page))

    def release_leftovers(self, req, tenant):
        """Releases every page request ``req`` still holds after SGLang's release of it, for a tree cache
        that keeps no pages (SGLang freed them all, or forgot some: then nothing else refers to them).
        In call order behind the deferred frees."""
        self._leftovers(self.request_id(req), self.tenant_id(tenant))

    def _leftovers(self, request, tenant):
        """:meth:`release_leftovers` by ids. Queued behind deferred operations, the pages it will release count
        in :meth:`available_size` at once: the request's holds now less the pages its queued frees and
        tree-kept slots name (exact for SGLang's whole-page frees of its own pages)."""
        if self._pending and request not in self._leftovers_counted:  # NOTE: a second one queued releases nothing more
            held = int(self._call(self._j.heldPages, request))
            self._pending_tokens += max(0, held - self._pending_pages_of.get(request, 0)) * self.page_size
            self._leftovers_counted.add(request)
        self._run_or_defer(("leftovers", request, tenant))

    # ------------------------------------------------------------ forward launches (CUDA)

    def note_forward_launch(self, event=None):
        """SGLang calls this with an event recorded at each forward launch (the plug-in also calls it
        with none after each ``ModelRunner.forward``, for the current stream): protection of pages
        released later waits for that forward. No-op on host memory."""
        if self._launch_fence is None:
            return
        if event is None:
            self._launch_fence.note_stream_launch()
        else:
            self._launch_fence.note_forward_launch(event)

    def host_syncs(self):
        """Blocking device->host copies of index tensors this allocator made: only an unattributed
        extension of a partial page (SGLang's device ``last_loc``); frees never add to it."""
        return self._host_syncs

    def _to_host(self, t):
        if t.device.type != "cpu":
            self._host_syncs += 1
        return t.to("cpu")

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except self._jpype.JException as e:
            raise from_java(e) from None

    # ------------------------------------------------------------ allocate

    def available_size(self):
        """Token slots free now, counting each deferred free as the whole pages its slots span (a segment's
        from its first page's start), the frees a release or free group passed to the pool before its end
        from the moment that end is called (queued behind deferred frees, it has not run yet), and a queued
        release of a request's leftovers: exact for SGLang's frees (whole pages of one request or tree
        node, at most one partial tail page), so an eviction followed by ``available_size()`` and an
        allocation in the same step works; an allocation that needs those pages resolves the deferred
        frees first. It overstates only when a deferred free is rejected (double, stale, foreign:
        counted as today) or its pages stay claimed."""
        return int(self._jalloc.availableTokens()) + self._pending_tokens  # read-only: does not seal the pool set

    def _out(self, n):
        out = torch.from_numpy(self._io_np[:n].copy())
        return out if self.device in ("cpu", None) else out.to(self.device, non_blocking=True)

    def _host_slots_to_io(self, slots, n):
        """Copies ``n`` host slot indices into ``io[0, n)``: a contiguous int64 tensor by one memmove of its
        ``n * 8`` bytes (a tensor's ``numpy()`` view costs more than the copy), any other through numpy.
        Always the tensor's values: a negative view's memory holds their negation, so it is resolved first."""
        if slots.dtype is torch.int64 and slots.is_contiguous() and not slots.is_neg():
            _memmove(self._io_addr, slots.data_ptr(), n * 8)
        else:
            self._io_np[:n] = (slots if slots.dim() == 1 else slots.reshape(-1)).resolve_neg().numpy()

    def alloc(self, need_size):
        """SGLang's ``alloc``: ``need_size`` slots (whole pages), or None when the pool cannot give them now,
        including a request for more than the whole pool (as SGLang answers it)."""
        need_size = int(need_size)
        if need_size == 0:
            return torch.empty((0,), dtype=torch.int64, device=self.device)
        if need_size > self.size:
            return None
        if self._pending and (self._hand_out_after(self._plan_rows) or need_size > self._j.availableTokens()):
            self.resolve_frees()
        r = self._call(self._j.alloc, need_size, self._plan_rows, self._take_flags())
        return None if r < 0 else self._out(need_size)

    def _hand_out_after(self, rows):
        """Whether an allocation planned by the first ``rows`` plan rows must wait for the queued operations: a queued
        operation is judged against the holds as they stand when it reaches the pool, so one presenting the holds of
        a holder this allocation hands pages to (a row's request, or the unattributed holds, which rows without a
        request and unattributed allocations get) would see that holder's new pages (a stale free releasing them, a
        queued leftovers release taking them). Those reach the pool first, as of their calls."""
        if self._pending_unattributed:
            return True
        held = self._pending_holders
        return bool(held) and any(r in held for r in self._plan_np[0:PLAN_ROW * rows:PLAN_ROW].tolist())

    def _alloc_plan(self, prefix_lens_cpu, seq_lens_cpu, last_loc, extend_num_tokens):
        bs = len(seq_lens_cpu)
        self._plan_room(bs)
        p = self._plan[: PLAN_ROW * bs].view(bs, PLAN_ROW)
        if self._plan_rows != bs:  # no attribution for this batch: unknown requests of the default tenant
            p[:, 0] = -1
            p[:, 1] = self._j.defaultTenant()
        attributed = self._plan_rows == bs
        p[:, 2] = prefix_lens_cpu
        p[:, 3] = seq_lens_cpu
        if self._pending:  # SGLang's own count of new pages, from host values
            new_pages = int(((p[:, 3] + self.page_size - 1) // self.page_size
                             - (p[:, 2] + self.page_size - 1) // self.page_size).sum())
            if self._hand_out_after(bs) or new_pages > self._j.availablePages():
                self.resolve_frees()
        # NOTE: last_loc matters only for a partial prefix page and SGLang keeps it on the device:
        # attributed rows leave it -1 and Java takes the request's partial page from its page list.
        if last_loc is None or (attributed and last_loc.device.type != "cpu"):
            p[:, 4] = -1
        else:
            p[:, 4] = self._to_host(last_loc)
        r = self._call(self._j.allocExtend, bs, int(extend_num_tokens), self._take_flags())
        if r == -2:  # a row's request holds no page here: only SGLang's last_loc can say
            if last_loc is None:
                raise KvShieldError("alloc_extend needs last_loc: a request extends a partial page this allocator"
                                    " cannot name")
            p[:, 4] = self._to_host(last_loc)
            r = self._call(self._j.allocExtend, bs, int(extend_num_tokens), 0)
        return None if r < 0 else self._out(int(extend_num_tokens))

    def alloc_extend(self, prefix_lens, prefix_lens_cpu, seq_lens, seq_lens_cpu, last_loc, extend_num_tokens,
                     num_new_pages=None):
        self._require_paged("alloc_extend")
        return self._alloc_plan(prefix_lens_cpu, seq_lens_cpu, last_loc, extend_num_tokens)

    def alloc_decode(self, seq_lens, seq_lens_cpu, last_loc):
        self._require_paged("alloc_decode")
        return self._alloc_plan(seq_lens_cpu - 1, seq_lens_cpu, last_loc, len(seq_lens_cpu))

    def _require_paged(self, what):
        if self.page_size == 1 and not isinstance(self, PagedTokenToKVPoolAllocator):
            raise NotImplementedError(f"{what} is only for paged allocator")

    # ------------------------------------------------------------ free

    def free(self, free_index):
        """SGLang's ``free``, as the releasing request's holds inside :meth:`releasing`, else as the tree
        cache's (or unattributed) holds. Host slots (with nothing pending) reach the pool now; device
        slots, and any free while one is pending, are deferred to :meth:`resolve_frees` without waiting
        on the device (``available_size()`` counts them at once, outside a free group). Inside a free
        group the pages stay held until :meth:`free_group_end`; a page freed twice is refused."""
        n = self._slot_tensor("free", free_index)
        if n == 0:
            return
        op = ("free", n, self._releasing_tenant, self._releasing_request, self._context_flags())
        if not free_index.is_cpu or self._pending:
            self._defer(op, free_index)
            return
        if self._held is not None:
            self._run_held()  # NOTE: before io is overwritten
        self._host_slots_to_io(free_index, n)
        if self._releasing_request >= 0 and self.is_not_in_free_group and self._may_hold:
            self._held = op
        else:
            self._run(op)

    def free_segment(self, free_index, *, start_pos):
        """Frees ``kv_row[start_pos : start_pos + n]`` of one request: the pages those positions touch (an
        unaligned start frees the page it falls in, as SGLang's does). Inside the request's release
        (:meth:`releasing`) a device tensor is never read: its pages come from the request's page list
        (SGLang avoids the sync here too); elsewhere, or when the list cannot name every page, the
        slots are freed like :meth:`free`. Inside a free group, as :meth:`free`."""
        n = self._slot_tensor("free_segment", free_index)
        if n == 0:
            return
        if self._releasing_request < 0:
            self.free(free_index)
            return
        head = int(start_pos) % self.page_size
        op = ("segment", n, self._releasing_tenant, self._releasing_request, self._context_flags(),
              int(start_pos) - head, n + head)  # the same pages, from the first one's start
        if self._pending:  # NOTE: behind the pending operations, so they reach the pool in call order
            self._defer(op, free_index)
        elif not self._run(op):
            self.free(free_index)

    def _slot_tensor(self, what, slots):
        """The number of slot indices in ``slots``, for every entry point that takes them; raises, changing
        nothing, for a tensor that cannot name this pool's slots (not int64/int32, more slots than the pool)."""
        n = slots.numel()
        if n and slots.dtype not in _INT_DTYPES:
            raise KvShieldError(f"{what}() needs int64 or int32 slot indices, got {slots.dtype}")
        if n > self._slot_count:
            raise KvShieldError(f"{what}() of {n} slots; the pool has {self._slot_count}")
        return n

    @property
    def _may_hold(self):
        """Whether a request's host free may wait for its release's end (:meth:`releasing`): not where a
        refusal must raise at the free itself (strict mode, SGLang's debug mode)."""
        return not self.strict and not self.debug_mode

    def _run_held(self):
        """Runs the held free (its slots still in ``io``) as it would have run at its call: before any
        other crossing or ``io`` write, so pool operations keep their call order."""
        op, self._held = self._held, None
        self._run(op)

    def _context_flags(self):
        """The flags a free carries from its context: deferred inside a free group or a request's release,
        the tree cache's holds while it evicts (outside a request)."""
        deferred = self._releasing_request >= 0 or not self.is_not_in_free_group
        return (IN_FREE_GROUP if deferred else 0) | (CACHE_EVICTION if self._evicting else 0)

    def free_group_begin(self):
        """SGLang's free group: pages freed inside stay held (as deferred frees) until
        :meth:`free_group_end` releases them all; a page freed twice in the group is refused as a
        double free (SGLang's debug check finds it too). Nesting raises (SGLang's would drop the
        outer group's frees)."""
        if not self.is_not_in_free_group:
            raise KvShieldError("free groups cannot be nested")
        self.is_not_in_free_group = False

    def free_group_end(self):
        self.is_not_in_free_group = True
        self._pending_tokens += self._group_tokens
        self._group_tokens = 0
        if self._pending and self._listed:  # NOTE: the end waits; the group's frees already in the pool count now
            self._count_listed(int(self._call(self._j.pendingGroupPages)) * self.page_size - self._listed_tokens)
        self._run_or_defer(("end_group",))

    def _end_request(self, request, tenant):
        """Ends a request's release: its frees in the pool's deferred list are released. Queued behind
        deferred operations, the frees of it already in that list count in :meth:`available_size` at once,
        as the deferred ones do."""
        if self._pending and self._listed:
            mine = int(self._call(self._j.pendingRequestPages, request, tenant)) * self.page_size
            uncounted = int(self._call(self._j.pendingGroupPages)) * self.page_size - self._listed_tokens
            self._count_listed(min(mine, uncounted))
        self._run_or_defer(("end_request", request, tenant))

    def _count_listed(self, tokens):
        tokens = max(0, tokens)  # NOTE: the list only grows while operations wait, so never below; kept safe
        self._pending_tokens += tokens
        self._listed_tokens += tokens

    # ------------------------------------------------------------ deferred operations

    def _run_or_defer(self, op):
        if self._pending:
            self._queue(op, 0, None)
        else:
            self._run(op)

    def _queue(self, op, off, event):
        """Appends ``op`` (its slots, if any, staged at ``off``, copied once ``event`` completes) to the queued operations,
        noting whose holds it presents (:meth:`_hand_out_after`)."""
        self._pending.append((op, off, event))
        kind = op[0]
        if kind in ("free", "segment", "adopt_slots"):
            request, flags = op[3], op[4]
            if request >= 0:
                self._pending_holders.add(request)
            elif not flags & CACHE_EVICTION:
                self._pending_unattributed = True
        elif kind != "end_group":  # adopt, end_request, leftovers: ("kind", request, tenant, ...)
            self._pending_holders.add(op[1])

    def _run(self, op):
        """One crossing for ``op`` (slots, where it has some, already in ``io``). Returns False only for
        a segment the request's page list cannot name (nothing freed: the caller frees its slots)."""
        kind = op[0]
        if kind == "free":
            _, n, tenant, request, group = op
            self._listed |= bool(group & IN_FREE_GROUP)
            self._log_rejected(self._call(self._j.free, n, tenant, request, self._take_flags() | group), n)
        elif kind == "segment":
            _, n, tenant, request, group, start, count = op
            self._listed |= bool(group & IN_FREE_GROUP)
            rejected = self._call(self._j.freeSegment, request, start, count, tenant, self._take_flags() | group)
            if rejected < 0:
                return False
            self._log_rejected(rejected, n)
        elif kind == "adopt":
            _, request, tenant, to_page = op
            self._call(self._j.adoptIntoCache, request, tenant, 0, to_page, self._take_flags())
        elif kind == "adopt_slots":
            _, n, tenant, request, _ = op
            self._log_rejected(self._call(self._j.adoptSlots, n, tenant, request, self._take_flags()), n)
        elif kind == "end_request":
            _, request, tenant = op
            self._call(self._j.endRequestFrees, request, tenant, self._take_flags())
        elif kind == "leftovers":
            _, request, tenant = op
            self._call(self._j.releaseLeftovers, request, tenant, self._take_flags())
        else:
            self._call(self._j.endFreeGroup, self._take_flags())
            self._listed = False  # NOTE: a group's end releases the whole deferred list
        return True

    def _defer(self, op, free_index):
        """Queues ``op`` behind the pending ones with its slots staged: device slots by a non-blocking
        copy and an event after it, host slots copied now."""
        if self._held is not None:
            self._run_held()  # NOTE: it came first, so it reaches the pool before the deferred ones
        n = op[1]
        if self._staged_slots + n > self._slot_count:  # NOTE: bounded by the pool's slots; depends on sizes only
            self.resolve_frees()
            if not self._pending and free_index.device.type == "cpu":
                self._host_slots_to_io(free_index, n)
                if not self._run(op):
                    self.free(free_index)
                return
        if self._staging is None:
            self._staging = torch.empty(self._slot_count, dtype=torch.int64,
                                        pin_memory=self._layout["device_type"] != "cpu")
        off, event = self._staged_slots, None
        dst = self._staging[off: off + n]
        if free_index.device.type == "cpu":
            dst.copy_(free_index.reshape(-1))
        else:
            event = self._stage_from_device(dst, free_index)
        self._staged_slots += n
        self._queue(op, off, event)
        spanned = op[6] if op[0] == "segment" else n  # NOTE: a segment's slots from its first page's start
        pages = -(-spanned // self.page_size)
        if op[3] >= 0:  # a request's: what its leftovers will not hold (see _leftovers)
            self._pending_pages_of[op[3]] = self._pending_pages_of.get(op[3], 0) + pages
        if op[0] in ("free", "segment"):
            if self.is_not_in_free_group:
                self._pending_tokens += pages * self.page_size
            else:  # NOTE: SGLang's free group makes its pages available only after free_group_end
                self._group_tokens += pages * self.page_size

    def _stage_from_device(self, dst, free_index):
        """Enqueues the copy on the index tensor's current stream (dtype converted on the device) and
        records an event after it; nothing waits here."""
        cuda = launch_fence.torch_cuda()
        dst.copy_(free_index.reshape(-1), non_blocking=True)
        event = self._spare_events.pop() if self._spare_events else cuda.Event()
        event.record(cuda.current_stream(free_index.device))
        return event

    def pending_frees(self):
        """Deferred operations (frees, segments, cache adoptions, group ends) not yet handed to the pool."""
        return len(self._pending)

    def resolve_frees(self):
        """Hands every deferred operation to the pool, in call order: waits for each one's copy event
        (never polls it: what is pending depends only on the calls, so every tensor-parallel rank
        resolves at the same point), then one crossing each, with its own checks. Runs at the step
        boundary (by then SGLang has synced on the step's results, so the copies are done), when an
        allocation needs more pages than the pool has without them or hands pages to a holder whose holds a
        queued operation presents (:meth:`_hand_out_after`), when the staging buffer is full,
        and in ``clear``/``close``; tests and strict-mode checks call it directly. Java crossings
        outside the allocator that move pages (the prefix cache, handoffs, prefill sends) call it
        first, so pages move in call order: a deferred double free is then refused instead of
        landing on a page that crossing hands to a new owner. Nothing pending: returns at once.

        Refusals found here are handled as in :meth:`free`: counted, audited and dropped in
        production; in strict mode the first one is raised (with the Java message) after every other
        pending operation was resolved, and the refused free released nothing. A slot outside the
        pool raises here in either mode (where an immediate :meth:`free` raises at once)."""
        if self._held is not None:
            self._run_held()
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        self._pending_tokens = self._group_tokens = self._staged_slots = self._listed_tokens = 0
        self._pending_pages_of = {}
        self._leftovers_counted = set()
        self._pending_holders = set()
        self._pending_unattributed = False
        first_error = None
        for op, off, event in pending:
            if event is not None:
                event.synchronize()
                self._spare_events.append(event)
            try:
                if op[0] in ("free", "segment", "adopt_slots"):
                    self._io[:op[1]].copy_(self._staging[off: off + op[1]])
                if not self._run(op):  # a segment the page list cannot name: freed by its slots
                    _, n, tenant, request, group = op[:5]
                    self._run(("free", n, tenant, request, group))
            except KvShieldError as e:
                first_error = first_error or e
        if first_error is not None:
            raise first_error

    def _log_rejected(self, rejected, n):
        if rejected:
            why = self._j.lastRejection()
            logger.warning("kvshield refused %d page(s) of a free of %d slots (counted, audited, dropped): %s",
                           rejected, n, why)
            if self.debug_mode:  # NOTE: SGLang's debug mode asserts on double frees; so does kvshield's
                raise RejectedFreeError(f"kvshield refused {rejected} page(s) of a free of {n} slots: {why}")

    def merge_and_sort_free(self):
        # NOTE: the pool orders its own free list; released pages are reusable only after protection.
        return None

    def get_all_free_pages(self):
        return None

    def clear(self):
        """Releases every page (SGLang's flush), after the deferred frees; pages return after
        protection, at the next step boundary."""
        try:
            self.resolve_frees()
        finally:
            if self._sealed:  # NOTE: else no page was ever handed out, and the set of KV pools stays open
                self._call(self._j.releaseAll)
            self.is_not_in_free_group = True
            self._plan_rows = 0

    def resize(self, config):
        """SGLang's resize after CUDA-graph capture (``post_capture_resize_kv_pool``): the pool is rebuilt for
        ``config.max_total_num_tokens`` over the same KV buffers. Only an empty pool is resized (SGLang
        resizes before serving); one holding pages raises, naming how many, and stays as it was. A new size the
        pool refuses to open at (strict admission: too small for one max-length request) raises the pool's error
        and leaves an empty pool of the old size."""
        new_size = int(config.max_total_num_tokens)
        if new_size <= 0 or new_size % self.page_size:
            raise KvShieldError(f"resize to {new_size} tokens: needs a positive multiple of page_size {self.page_size}")
        if new_size > self.size and not self._no_kv_memory:
            raise KvShieldError(f"resize from {self.size} to {new_size} tokens: the KV buffers hold {self.size}")
        self.resolve_frees()
        owned = len(self._pages_in(_OWNED_STATES))
        if owned:
            raise KvShieldError(f"resize from {self.size} to {new_size} tokens while {owned} page(s) are owned; "
                                "SGLang resizes an empty pool")
        self._jalloc.close()
        try:
            self._open(self._layout, new_size)
        except BaseException:
            self._open(self._layout, self.size)  # NOTE: the empty pool as it was (a new one, scrubbed at its open)
            self._bind()
            raise
        self.size = new_size
        if self.page_size > 1:
            self.num_pages = new_size // self.page_size
        self._staging = None
        self._bind()

    def get_cpu_copy(self, indices, mamba_indices=None):
        """SGLang's retraction offload (``Req.offload_kv_cache``): the KV bytes at ``indices`` copied to host
        memory by the KV pool, as SGLang's allocator does. The copy holds one request's KV until
        :meth:`load_cpu_copy` puts it back (and zeroes it); one SGLang drops without a reload (the request
        aborted while retracted) is zeroed when it is dropped, so its host memory is freed holding no KV."""
        if self._no_kv_memory:
            raise KvShieldError("get_cpu_copy on an allocator without KV memory (kvcache=None)")
        copy = self._kvcache.get_cpu_copy(indices, mamba_indices=mamba_indices)
        _zero_when_dropped(copy)
        return copy

    def load_cpu_copy(self, kv_cache_cpu, indices, mamba_indices=None):
        """SGLang's retraction reload (``Req.load_kv_cache``) into the request's newly allocated ``indices``;
        afterwards every tensor of the host copy is zeroed, so no KV bytes stay behind in host memory
        SGLang drops without scrubbing."""
        if self._no_kv_memory:
            raise KvShieldError("load_cpu_copy on an allocator without KV memory (kvcache=None)")
        try:
            return self._kvcache.load_cpu_copy(kv_cache_cpu, indices, mamba_indices=mamba_indices)
        finally:
            _zero_host_copy(kv_cache_cpu)

    # ------------------------------------------------------------ admission and diagnostics

    def admission_limits(self):
        """(effective, advertised) request limits in tokens, as the pool computed them."""
        a = self._j.admission()
        return int(a.effectiveTokens()), int(a.advertisedTokens())

    def tenant_quota_pages(self, tenant):
        """The page quota of ``tenant`` (a name), or None when it has none."""
        quota = int(self._j.pool().tenants().policy(self.tenant_id(tenant)).quotaPages())
        return None if quota < 0 else quota

    def tenant_owned_pages(self, tenant):
        """Pages ``tenant`` (a name) owns now."""
        return int(self._j.pool().ownedBy(self.tenant_id(tenant)))

    def rejected_frees(self):
        return int(self._j.rejectedFrees())

    def unattributed_pages(self):
        """Pages handed out with no plan row (an allocation outside SGLang's hooked planning paths, such as
        HiCache's load-back): they share one unattributed holder, so a stale free of their slots after
        another such allocation got the page cannot be told from that allocation's own free (design note 20).
        SGLang's scheduler paths kvshield hooks allocate none."""
        return int(self._j.unattributedPages())

    def page_owner(self, page):
        """(tenant name or None, request id int or -1) of a page."""
        t = int(self._j.tenantOf(page))
        return (str(self._j.tenantName(t)) if t >= 0 else None), int(self._j.requestOf(page))

    def close(self):
        try:
            self._finish_step()
        finally:
            self._j.close()


class _Releasing:
    """:meth:`_KvShieldMixin.releasing` as a plain context manager (a generator-based one costs a few
    microseconds per request release)."""

    __slots__ = ("_alloc", "_tenant", "_req", "_leftovers", "_prev")

    def __init__(self, alloc, tenant, req, leftovers):
        self._alloc, self._tenant, self._req, self._leftovers = alloc, tenant, req, leftovers

    def __enter__(self):
        a = self._alloc
        self._prev = a._releasing_tenant, a._releasing_request
        a._releasing_tenant = a.tenant_id(self._tenant)
        a._releasing_request = a.request_id(self._req)

    def __exit__(self, exc_type, *exc):
        a = self._alloc
        tenant, request = a._releasing_tenant, a._releasing_request
        a._releasing_tenant, a._releasing_request = self._prev
        failed_clean, a._failed_naming_no_holds = a._failed_naming_no_holds == request, -1
        leftovers = self._leftovers and (exc_type is None or failed_clean)
        if a._session_kept and request in a._session_kept:  # NOTE: the session's slot keeps them for its next turn
            a._session_kept.discard(request)
            leftovers = False
        held = a._held
        if held is not None and held[2] == tenant and held[3] == request:
            if not a.is_not_in_free_group:  # NOTE: SGLang's free group opened after the free: the group ends it
                a._run_held()
            else:  # NOTE: this release's only operation: free, end and leftovers in one crossing
                a._held = None
                a._log_rejected(a._call(a._j.releaseRequest, held[1], tenant, request, leftovers,
                                        a._take_flags() | held[4]), held[1])
                return False
        if a.is_not_in_free_group:  # NOTE: else SGLang's free_group_end releases them with the group
            a._end_request(request, tenant)
        if leftovers:
            a._leftovers(request, tenant)
        return False


class TokenToKVPoolAllocator(_KvShieldMixin, _UpstreamToken):
    """SGLang's token allocator (``page_size == 1``) on kvshield."""

    _released_listed_first = False  # NOTE: SGLang's token allocator appends freed slots to free_pages

    def __init__(self, size, dtype, device, kvcache, need_sort, *, kvshield_settings=None, server_args=None,
                 extra_kvcaches=()):
        self._kvshield_init(size, 1, dtype, device, kvcache, need_sort, kvshield_settings, server_args, extra_kvcaches)
        _report_active(self)


class PagedTokenToKVPoolAllocator(_KvShieldMixin, _UpstreamPaged):
    """SGLang's paged allocator (``page_size > 1``) on kvshield."""

    _released_listed_first = True  # NOTE: SGLang's paged allocator prepends freed pages to free_pages

    def __init__(self, size, page_size, dtype, device, kvcache, need_sort, *, kvshield_settings=None, server_args=None,
                 extra_kvcaches=()):
        self._kvshield_init(size, page_size, dtype, device, kvcache, need_sort, kvshield_settings, server_args,
                            extra_kvcaches)
        self.num_pages = size // page_size
        _report_active(self)

    def alloc(self, need_size):
        if int(need_size) % self.page_size:
            raise KvShieldError(f"paged alloc needs a multiple of page_size {self.page_size}: need_size={need_size}")
        return _KvShieldMixin.alloc(self, need_size)


def _sglang_context_length(server_args):
    """The context length SGLang advertises, when it is known in this process."""
    ctx = getattr(server_args, "context_length", None)
    if ctx:
        return int(ctx)
    try:
        from sglang.srt.server_args import get_global_server_args

        return getattr(get_global_server_args(), "context_length", None)
    except (ImportError, AttributeError, ValueError, RuntimeError):
        return None


def agree_input_limit(scheduler, allocator):
    """Lowers SGLang's own limits (``max_req_len``, ``max_req_input_len``) to the pool's effective
    limit, so SGLang rejects what kvshield would reject, and exports both limits as metrics."""
    effective, advertised = allocator.admission_limits()
    max_req_len = getattr(scheduler, "max_req_len", None)
    if max_req_len is not None and max_req_len > effective:
        margin = max_req_len - getattr(scheduler, "max_req_input_len", max_req_len)
        scheduler.max_req_len = effective
        scheduler.max_req_input_len = max(1, effective - margin)
        logger.warning("kvshield: lowered SGLang's request limit from %d to the pool's effective %d tokens",
                       max_req_len, effective)
    export_admission_metrics(effective, advertised)
    return effective, advertised


def export_admission_metrics(effective, advertised):
    """Gauges ``kvshield_admission_limit_tokens{kind=effective|advertised}`` in SGLang's Prometheus registry."""
    try:
        from prometheus_client import Gauge
    except ImportError:
        return False
    global _ADMISSION_GAUGE
    if _ADMISSION_GAUGE is None:
        _ADMISSION_GAUGE = Gauge("kvshield_admission_limit_tokens", "request length limits of the KV pool", ["kind"],
                                 multiprocess_mode="mostrecent")
    _ADMISSION_GAUGE.labels(kind="effective").set(effective)
    _ADMISSION_GAUGE.labels(kind="advertised").set(advertised)
    return True


_ADMISSION_GAUGE = None
_memmove = ctypes.memmove


def _forget_request(ids, key, ref):
    """A request object went: drops its id entry, unless the key names a newer request by now."""
    entry = ids.get(key)
    if entry is not None and entry[0] is ref:
        del ids[key]


_POOLS_OPENED = itertools.count(1)  # Java pools this process opened (each its own pool id and audit trail)


def _tensors_in(obj):
    """Every tensor of a (nested list/tuple/dict of) host copy."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _tensors_in(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_in(v)


def _zero_when_dropped(copy):
    """Zeroes each tensor of a host copy when the copy drops it: a detached alias of each keeps its memory until
    the tensor itself is gone, then zeroes it (whatever container the pool returned: lists, dicts, tuples)."""
    for t in _tensors_in(copy):
        weakref.finalize(t, torch.Tensor.zero_, t.detach())


def _zero_host_copy(copy):
    for t in _tensors_in(copy):
        t.zero_()


def _label(name):
    """A request's name as the audit trail takes it: 1 to 256 printable characters (control characters and
    unpaired surrogates escaped, then cut), or None."""
    if not isinstance(name, str):
        name = None if name is None else str(name)
    if name is not None and not (name.isprintable() and len(name) <= 256):
        name = ascii(name)[1:-1][:256]
    return name or None


def _close_at_exit(ref, jalloc):
    """At interpreter exit (registered after JPype's, so it runs before the JVM stops): closes the Java allocator
    the Python one opened, writing its audit trail's final signed checkpoint; through the Python allocator while it
    still uses it (its deferred frees resolved first). Closing a closed one (a resize closed it) does nothing."""
    allocator = ref()
    try:
        if allocator is not None and allocator._jalloc is jalloc:
            allocator.close()
        else:
            jalloc.close()
    except Exception:  # NOTE: nothing else can be done at exit; the trail's tail stays unsealed, and verify says so
        logger.exception("kvshield: closing the allocator at exit failed: its audit trail's tail is not sealed")


def _report_active(allocator):
    """Records this process's rank (see :mod:`ranks`) when a rank directory is set: protected only when the
    allocator has KV memory and every hook the plug-in installs is in place in this process. A failed hook
    then also stops this scheduler, naming it (after the report, so the gate names it too)."""
    if not os.environ.get(ranks.ENV_DIR):
        return
    problems = hooks.failed()
    if not hooks.loaded():
        problems.append("plug-in: kvshield_sglang.plugin.load() did not run in this process, so no hook is installed")
    if allocator._no_kv_memory:
        problems.append("allocator: built without KV memory (kvcache=None)")
    ranks.report(_this_rank(), not problems, allocator.kvshield_rank_detail, hooks=hooks.results(), problems=problems,
                 server=hooks.scheduler_server())
    if hooks.failed():
        raise UnsupportedFeatureError("kvshield cannot protect this rank; hooks not installed: " + "; ".join(hooks.failed()))


def _this_rank():
    return os.environ.get("KVSHIELD_RANK_NAME") or ranks.rank_name(*hooks.rank_identity())


__all__ = ["TokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator", "UnsupportedFeatureError"]
