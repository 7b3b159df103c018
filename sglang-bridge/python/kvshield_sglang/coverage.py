"""Makes SGLang hand kvshield's allocator everything it must protect, and stops a rank that would
leave KV memory outside it.

SGLang builds a scheduler's KV pools in ``KVCacheConfigurator`` (``mem_cache/kv_cache_configurator.py``):
``_init_pools`` builds the pool, then ``_build_token_to_kv_pool_allocator`` the allocator over it,
without the server args; a draft worker (EAGLE, MTP heads) runs the same path later with the
target's allocator passed in, and builds its own pool over the same token slots. :func:`install`
wraps, checked by name and signature (a mismatch stops the rank, naming it):

- ``_build_token_to_kv_pool_allocator``: refuses pool classes and server features kvshield does not
  cover before anything is built (the SWA pool included: SGLang's SWA allocator would build
  kvshield sub-allocators over its sub-pools), lends the server args to the allocator being built
  (:func:`building`), and registers a draft worker's pool with the shared allocator(s), so every
  buffer of every pool on those slots is scrubbed or sealed on release;
- ``_init_pools``: refuses server features kvshield does not cover first (unified memory pools
  never reach the allocator hook); after it, the allocator must be kvshield's (or SGLang's SWA
  allocator over kvshield sub-allocators, when the ``swa`` gap is accepted) and protect the pool
  returned, else the rank stops naming both (out-of-tree platforms, any path not known);
- ``kv_cache_builder.resolve_decode_retraction_backup``: a decode server's retraction host pool
  (its default) is refused unless the ``retraction-host-pool`` gap is accepted.
"""

import dataclasses
import functools
import inspect
import threading
from typing import NamedTuple

from . import buffers
from .errors import UnsupportedFeatureError

CONFIGURATOR = "sglang.srt.mem_cache.kv_cache_configurator"
BUILDER = "sglang.srt.mem_cache.kv_cache_builder"
# What kvshield calls, as SGLang declares it: method -> its parameters, in order.
METHODS = {
    "_build_token_to_kv_pool_allocator": ("self", "sizes", "token_to_kv_pool", "is_dsv4_model", "req_to_token_pool",
                                          "token_to_kv_pool_allocator"),
    "_init_pools": ("self", "sizes", "req_to_token_pool", "token_to_kv_pool_allocator"),
}
FIELDS = ("server_args", "is_draft_worker", "page_size")
RETRACTION = ("resolve_decode_retraction_backup", ("tp_worker",))
_WRAPPED = "__kvshield_coverage__"


class Building(NamedTuple):
    """What the configurator knows while it builds an allocator: its server args, whether it is a
    draft worker's, and the KV pool it builds it over."""

    server_args: object
    is_draft_worker: bool
    kvcache: object


_local = threading.local()


def building():
    """The :class:`Building` of the allocator SGLang is building on this thread now, or None."""
    return getattr(_local, "building", None)


class _Lend:
    def __init__(self, b):
        self.b = b

    def __enter__(self):
        self.prev = building()
        _local.building = self.b

    def __exit__(self, *exc):
        _local.building = self.prev


def check_signature(fn, expected, where):
    """Raises UnsupportedFeatureError unless ``fn``'s parameters are exactly ``expected``, naming both."""
    try:
        found = tuple(inspect.signature(fn).parameters)
    except (TypeError, ValueError) as e:
        found = f"no signature ({e})"
    if found != tuple(expected):
        raise UnsupportedFeatureError(
            f"{where} takes {found}; kvshield's coverage hook needs {tuple(expected)}. This SGLang version is not"
            " supported: kvshield would not see every KV pool it must protect; refusing to start")


def kvshield_pairs(allocator, kvcache):
    """(kvshield allocator, KV pool) pairs that must protect ``kvcache``'s buffers under ``allocator``:
    the allocator itself, or the sub-allocators of SGLang's SWA allocator over the SWA pool's
    sub-pools. Raises naming the classes when kvshield manages neither."""
    if hasattr(allocator, "kvshield_register_kvcache"):
        return [(allocator, kvcache)]
    subs = [(getattr(allocator, a, None), getattr(kvcache, p, None))
            for a, p in (("full_attn_allocator", "full_kv_pool"), ("swa_attn_allocator", "swa_kv_pool"))]
    if all(hasattr(a, "kvshield_register_kvcache") and p is not None for a, p in subs):
        return subs
    raise UnsupportedFeatureError(
        f"SGLang built {type(allocator).__qualname__} over {type(kvcache).__qualname__}; kvshield manages neither"
        " that allocator nor its sub-allocators, so these KV pages would not be protected; refusing to start")


def check_covered(allocator, kvcache):
    """Raises naming the pool unless every kvshield allocator of :func:`kvshield_pairs` protects its pool."""
    for a, pool in kvshield_pairs(allocator, kvcache):
        if not any(k is pool for k in a.kvshield_kvcaches()):
            raise UnsupportedFeatureError(
                f"KV pool {type(pool).__qualname__} shares {type(a).__name__}'s token slots but was never registered"
                " with it (built outside kvshield's hook); its pages would not be protected; refusing to start")


def _build_allocator_hook(orig):
    @functools.wraps(orig)
    def wrapper(self, **kw):
        pool, shared = kw["token_to_kv_pool"], kw["token_to_kv_pool_allocator"]
        accepted = buffers.accepted_gaps()
        hits = buffers.settle(buffers.server_args_refusals(self.server_args) + buffers.class_refusals(pool), accepted)
        with _Lend(Building(self.server_args, bool(self.is_draft_worker), pool)):
            out = orig(self, **kw)
        pairs = kvshield_pairs(out, pool)
        if shared is not None:  # NOTE: every sub-pool checked first, so a refused one leaves no sub-allocator changed
            for a, p in pairs:
                a.kvshield_check_kvcache(p)
        for a, p in pairs:
            if shared is not None:  # a draft worker's pool on the target's slots
                a.kvshield_register_kvcache(p)
            for gap in hits:  # e.g. swa: each sub-allocator sees one plain sub-pool; the rank's record names it
                a.kvshield_note_accepted_gap(gap)
        return out

    return wrapper


def _init_pools_hook(orig):
    @functools.wraps(orig)
    def wrapper(self, **kw):
        # NOTE: first, so a feature that builds no kvshield allocator at all (unified memory) is named.
        buffers.settle(buffers.server_args_refusals(self.server_args), buffers.accepted_gaps())
        out = orig(self, **kw)
        check_covered(out.token_to_kv_pool_allocator, out.token_to_kv_pool)
        return out

    return wrapper


def _retraction_hook(orig):
    @functools.wraps(orig)
    def wrapper(*, tp_worker):
        backend = orig(tp_worker=tp_worker)
        if backend == "host_pool":
            gap = "retraction-host-pool"
            buffers.refuse_unless_accepted(gap, buffers.accepted_gaps(),
                                           "kv_cache_builder.resolve_decode_retraction_backup chose host_pool")
            for a, _ in kvshield_pairs(*_allocator_and_pool(tp_worker)):
                a.kvshield_note_accepted_gap(gap)
        return backend

    return wrapper


def _allocator_and_pool(tp_worker):
    allocator = tp_worker.get_memory_pool()[1]
    return allocator, allocator.get_kvcache()


def install(configurator=None, builder=None):
    """Wraps SGLang's KV pool construction (see the module docstring); idempotent. Checks every
    name and signature first and wraps nothing unless all match.

    :raises UnsupportedFeatureError: naming what does not match, or why SGLang's modules cannot be
        imported (the rank must not start with pools kvshield cannot see)
    """
    import importlib

    try:
        configurator = configurator or importlib.import_module(CONFIGURATOR)
        builder = builder or importlib.import_module(BUILDER)
    except ImportError as e:
        raise UnsupportedFeatureError(f"cannot hook SGLang's KV pool construction ({CONFIGURATOR}, {BUILDER}): {e};"
                                      " refusing to start") from e
    cls = getattr(configurator, "KVCacheConfigurator", None)
    if cls is None:
        raise UnsupportedFeatureError(f"{CONFIGURATOR} has no KVCacheConfigurator; refusing to start")
    for name, params in METHODS.items():
        check_signature(getattr(cls, name, None), params, f"KVCacheConfigurator.{name}")
    fields = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
    missing = [f for f in FIELDS if f not in fields]
    if missing:
        raise UnsupportedFeatureError(f"KVCacheConfigurator has no field(s) {missing}; kvshield's coverage hook needs"
                                      f" {list(FIELDS)}; refusing to start")
    name, params = RETRACTION
    check_signature(getattr(builder, name, None), params, f"{BUILDER}.{name}")
    for attr, hook in (("_build_token_to_kv_pool_allocator", _build_allocator_hook), ("_init_pools", _init_pools_hook)):
        fn = getattr(cls, attr)
        if not getattr(fn, _WRAPPED, False):
            wrapped = hook(fn)
            setattr(wrapped, _WRAPPED, True)
            setattr(cls, attr, wrapped)
    fn = getattr(builder, name)
    if not getattr(fn, _WRAPPED, False):
        wrapped = _retraction_hook(fn)
        setattr(wrapped, _WRAPPED, True)
        setattr(builder, name, wrapped)
