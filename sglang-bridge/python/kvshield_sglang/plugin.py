"""SGLang plug-in: ``load()`` is the ``sglang.srt.plugins`` entry point, run in every SGLang process.

In each process it:

- exports a rank directory (``$KVSHIELD_RANK_DIR``) so scheduler processes spawned later inherit it;
- replaces SGLang's ``TokenToKVPoolAllocator`` and ``PagedTokenToKVPoolAllocator`` with kvshield's,
  in their modules and in every module already holding them by name;
- wraps SGLang's per-request allocation planning (``alloc_for_extend``/``alloc_for_decode``) so
  pages are attributed to each request and tenant and each step runs one step boundary, and
  ``release_kv_cache`` so a request's frees are checked against its tenant;
- hooks the disaggregation queues (:mod:`kvshield_sglang.disagg`; COMPLIANCE refuses an SGLang
  without the upstream handoff-isolation fix) and registers the ``kvshield`` radix-cache backend;
- in the launching process, wraps the server's ready hook so it refuses to serve unless every
  rank reported kvshield active.
"""

import logging
import sys

from . import engine_hooks, ranks
from .tenants import TenantResolver

logger = logging.getLogger(__name__)
_TARGETS = {
    "sglang.srt.mem_cache.allocator.token": ("TokenToKVPoolAllocator", "TokenToKVPoolAllocator"),
    "sglang.srt.mem_cache.allocator.paged": ("PagedTokenToKVPoolAllocator", "PagedTokenToKVPoolAllocator"),
}
_installed = False


def load():
    """Entry point: idempotent; does nothing but export the rank directory when SGLang is absent."""
    global _installed
    ranks.ensure_dir()
    if _installed:
        return
    try:
        import importlib

        originals = {}
        from . import allocator

        if not allocator.SGLANG_AVAILABLE:
            return
        for module, (name, ours) in _TARGETS.items():
            mod = importlib.import_module(module)
            originals[getattr(mod, name)] = getattr(allocator, ours)
        replace_everywhere(originals)
        importlib.import_module(".coverage", __package__).install()  # every KV pool reaches the allocator
        engine_hooks.install()
        _wrap_planning()
        _wrap_scheduler_limits()
        _wrap_ready()
        from . import disagg, prefix_cache

        disagg.install_in_sglang()
        importlib.import_module(".disagg_prefill", __package__).install_in_sglang()  # prefill source-page claims
        prefix_cache.register()
        _installed = True
        logger.info("kvshield: SGLang KV allocators replaced in process")
    except ImportError as e:
        logger.warning("kvshield: SGLang not importable here (%s); nothing installed", e)


def replace_everywhere(replacements, modules=None):
    """Rebinds every module attribute that is one of ``replacements``' keys to its value; returns how many."""
    n = 0
    for mod in list((modules or sys.modules).values()):
        d = getattr(mod, "__dict__", None)
        if not isinstance(d, dict):
            continue
        for attr, value in list(d.items()):
            try:
                new = replacements.get(value)
            except TypeError:  # unhashable attribute values
                continue
            if new is not None:
                setattr(mod, attr, new)
                n += 1
    return n


def plan_rows(reqs, prefix_lens, seq_lens, resolver):
    """(rid, tenant, prefix_len, seq_len) per request, the tenant from trusted server-side data only."""
    return [(r.rid, resolver.resolve_request(r), int(p), int(s)) for r, p, s in zip(reqs, prefix_lens, seq_lens)]


def _wrap_planning():
    import functools

    from sglang.srt.mem_cache import common

    resolver = TenantResolver.from_env()

    def allocator_of(batch):
        a = batch.tree_cache.token_to_kv_pool_allocator
        return a if hasattr(a, "set_plan") else None

    def wrap_extend(fn):
        @functools.wraps(fn)
        def wrapper(batch, *a, **k):
            alloc = allocator_of(batch)
            if alloc is not None:
                alloc.begin_step()
                alloc.set_plan(plan_rows(batch.reqs, batch.prefix_lens, batch.seq_lens_cpu.tolist(), resolver))
            try:
                return fn(batch, *a, **k)
            finally:
                if alloc is not None:
                    alloc.clear_plan()
        return wrapper

    def wrap_decode(fn):
        @functools.wraps(fn)
        def wrapper(batch, token_per_req, *a, **k):
            alloc = allocator_of(batch)
            if alloc is not None:
                alloc.begin_step()
                seq = [int(s) + token_per_req for s in batch.seq_lens_cpu.tolist()]
                alloc.set_plan(plan_rows(batch.reqs, [s - token_per_req for s in seq], seq, resolver))
            try:
                return fn(batch, token_per_req, *a, **k)
            finally:
                if alloc is not None:
                    alloc.clear_plan()
        return wrapper

    def wrap_release(fn):
        @functools.wraps(fn)
        def wrapper(req, tree_cache, *a, **k):
            alloc = tree_cache.token_to_kv_pool_allocator
            if not hasattr(alloc, "releasing"):
                return fn(req, tree_cache, *a, **k)
            with alloc.releasing(resolver.resolve_request(req), req.rid):
                return fn(req, tree_cache, *a, **k)
        return wrapper

    replacements = {}
    for name, wrap in (("alloc_for_extend", wrap_extend), ("alloc_for_decode", wrap_decode),
                       ("release_kv_cache", wrap_release)):
        if hasattr(common, name):
            orig = getattr(common, name)
            replacements[orig] = wrap(orig)
    replace_everywhere(replacements)


def serving_gate(server_args, timeout_s=30.0):
    """Raises RankNotProtectedError unless every scheduler rank of ``server_args`` reported kvshield active."""
    expected = ranks.expected_ranks(getattr(server_args, "tp_size", 1) or 1, getattr(server_args, "dp_size", 1) or 1,
                                    getattr(server_args, "pp_size", 1) or 1)
    return ranks.verify(expected, timeout_s=timeout_s)


def _lookup(module, attr):
    """``module.attr`` when this SGLang version has it, else None (the hook is then not installed)."""
    import importlib

    try:
        return getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None


def _wrap_ready():
    import functools
    import os

    orig = _lookup("sglang.srt.entrypoints.http_server", "_wait_and_warmup")
    if orig is None:
        logger.warning("kvshield: this SGLang has no http_server._wait_and_warmup; the every-rank check is not installed")
        return

    @functools.wraps(orig)
    def wrapper(server_args, *a, **k):
        try:
            serving_gate(server_args)
        except Exception as e:  # noqa: BLE001  (any failure of the gate must stop the server)
            logger.error("kvshield: %s", e)
            try:
                from sglang.srt.utils import kill_process_tree

                kill_process_tree(os.getpid())
            finally:
                os._exit(1)
        return orig(server_args, *a, **k)

    replace_everywhere({orig: wrapper})


def _wrap_scheduler_limits():
    """After SGLang's scheduler built its pool and limits, make its input limit agree with the pool's."""
    import functools

    Scheduler = _lookup("sglang.srt.managers.scheduler", "Scheduler")
    orig = getattr(Scheduler, "init_memory_pool_and_cache", None)
    if orig is None:
        logger.warning("kvshield: this SGLang has no Scheduler.init_memory_pool_and_cache; input limits not aligned")
        return

    @functools.wraps(orig)
    def wrapper(self, *a, **k):
        out = orig(self, *a, **k)
        from .allocator import agree_input_limit

        alloc = getattr(self, "token_to_kv_pool_allocator", None)
        if hasattr(alloc, "admission_limits"):
            agree_input_limit(self, alloc)
        return out

    Scheduler.init_memory_pool_and_cache = wrapper
