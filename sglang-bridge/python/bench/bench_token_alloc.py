"""The bridge's alloc + free against SGLang's own allocators, same run, interleaved (ABAB).

For SGLang's token allocator (``page_size == 1``: ``sglang.srt.mem_cache.allocator.token.TokenToKVPoolAllocator``)
and, for comparison, the paged one (``PagedTokenToKVPoolAllocator``, ``--paged-page-size``, default 16), this
times one request's life per iteration at 1, 128 and 1024 tokens over pools of 4096, 32768 and 327664 tokens
(327,664: an 8B model's 40 GiB KV pool):

- SGLang's own class (the yardstick): ``x = alloc(n)``; ``free(x)``.
- The bridge, driven the way the plug-in drives it: a step boundary every step (``begin_step()``: the boundary
  rides on the step's first crossing, so its cost, including the previous step's released pages coming back,
  lands in the timed allocation); ``set_plan([(req, tenant, 0, n)])`` (one row per request, as
  ``alloc_for_extend``'s hook does); ``x = alloc(n)``; ``clear_plan()``; then the request's release as
  ``release_kv_cache``'s hook runs it: ``with releasing(tenant, req, leftovers=True): free(x)``.
  Each iteration uses a new request object (a stand-in for SGLang's ``Req``).

The timed region of both is the whole iteration after the step mark. Subjects alternate in blocks of
``--block`` iterations (A B A B ..., the first of each pair swapped every round), so drift (JIT, thermal,
other load) hits both alike; ``--warmup`` iterations of each are run first and dropped (the JVM compiles the
bridge's hot paths only after some thousand calls: with a short warm-up the bridge's figures are several times
its steady state). Reported per cell:
median and p90 in microseconds and the ratio bridge/upstream of the medians (and of the p90s). Host (CPU)
tensors: the bridge's device paths (deferred frees) are not exercised here.

Run (from the repository root, after ``mvn ... install``)::

    KVSHIELD_SGLANG_SOURCE=/work/shared/sglang-upstream /usr/bin/python3 sglang-bridge/python/bench/bench_token_alloc.py \\
        [--pools 4096,32768,327664] [--tokens 1,128,1024] [--paged-page-size 16 | 0] [--level NONE] \\
        [--iters 3000] [--warmup 10000] [--block 50] [--breakdown] [--json out.json] [--package-dir DIR]

``--breakdown`` adds the bridge's medians per part (plan, alloc, release). ``--json PATH`` writes every cell
(and the run's settings) as JSON; ``--json -`` prints it to stdout instead of the table. ``--package-dir DIR``
imports ``kvshield_sglang`` from ``DIR`` (a patched copy) instead of this tree's; ``KVSHIELD_CLASSPATH`` picks
the jars as at run time (:mod:`kvshield_sglang.runtime`), so two builds compare the same way.
"""

import argparse
import gc
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import sglang_source  # noqa: E402  (the real SGLang: installed, or KVSHIELD_SGLANG_SOURCE)

sglang_source.setup()
import torch  # noqa: E402
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator as UpstreamPaged  # noqa: E402
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator as UpstreamToken  # noqa: E402

TENANT = "bench"


class _Req:
    """A request object, as SGLang's ``Req`` is to the bridge: its identity is the object."""

    __slots__ = ("__weakref__",)


def _upstream_iteration(a, n, out):
    t0 = time.perf_counter_ns()
    x = a.alloc(n)
    a.free(x)
    out.append(time.perf_counter_ns() - t0)
    if x is None:
        raise RuntimeError(f"upstream alloc({n}) answered None")


def _bridge_iteration(a, n, out, parts):
    req = _Req()
    a.begin_step()
    t0 = time.perf_counter_ns()
    a.set_plan([(req, TENANT, 0, n)])
    t1 = time.perf_counter_ns()
    x = a.alloc(n)
    a.clear_plan()
    t2 = time.perf_counter_ns()
    with a.releasing(TENANT, req, leftovers=True):
        a.free(x)
    t3 = time.perf_counter_ns()
    out.append(t3 - t0)
    if parts is not None:
        parts[0].append(t1 - t0)
        parts[1].append(t2 - t1)
        parts[2].append(t3 - t2)
    if x is None:
        raise RuntimeError(f"bridge alloc({n}) answered None")


def _stats(ns):
    v = sorted(ns)
    return statistics.median(v) / 1e3, v[min(len(v) - 1, int(0.9 * len(v)))] / 1e3


def _per_token_line(small, large):
    """Each subject's cost split from two cells of one pool: fixed (the smaller request's median) and per further token."""
    def split(key):
        per_token_ns = 1e3 * (large[key] - small[key]) / (large["tokens"] - small["tokens"])
        return f"{small[key]:.1f} us + {per_token_ns:.1f} ns/token"

    return (f"  {small['class']} pool {small['pool_tokens']}: upstream {split('upstream_median_us')},"
            f" bridge {split('bridge_median_us')} (from {small['tokens']} to {large['tokens']} tokens)")


def measure_cell(upstream, bridge, n, iters, warmup, block, breakdown):
    """Interleaved blocks of each subject; returns (upstream ns list, bridge ns list, bridge parts)."""
    trash, trash_parts = [], [[], [], []]
    for _ in range(warmup):
        _upstream_iteration(upstream, n, trash)
        _bridge_iteration(bridge, n, trash, trash_parts)
    up, br = [], []
    parts = [[], [], []] if breakdown else None
    gc_was = gc.isenabled()
    gc.disable()  # NOTE: a collection lands on whichever subject is running; both allocate Python objects
    try:
        rounds = max(1, iters // block)
        for r in range(rounds):
            order = (0, 1) if r % 2 == 0 else (1, 0)
            for who in order:
                for _ in range(block):
                    if who == 0:
                        _upstream_iteration(upstream, n, up)
                    else:
                        _bridge_iteration(bridge, n, br, parts)
            if r % 20 == 19:
                gc.collect()
    finally:
        if gc_was:
            gc.enable()
    return up, br, parts


def build(kind, size, page_size, level):
    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    # NOTE: a 4-byte-per-token KV (1 layer, 1 head, head_dim 1) keeps byte work out of the bookkeeping figures.
    kv = MHAPool(size, page_size, layers=1, heads=1, head_dim=1)
    settings = {"level": level, "advertisedContextTokens": size}
    if kind == "token":
        return (UpstreamToken(size, torch.float32, "cpu", kv, False),
                TokenToKVPoolAllocator(size, torch.float32, "cpu", kv, False, kvshield_settings=settings))
    return (UpstreamPaged(size, page_size, torch.float32, "cpu", kv, False),
            PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", kv, False, kvshield_settings=settings))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pools", default="4096,32768,327664", help="pool sizes in tokens")
    # NOTE: the smallest request (one page) is the bridge's fixed cost per request: its calls, crossings and output
    p.add_argument("--tokens", default="1,128,1024", help="tokens per request")
    p.add_argument("--paged-page-size", type=int, default=16, help="page size of the paged comparison (0: none)")
    p.add_argument("--level", default="NONE", help="the bridge's protection level")
    p.add_argument("--iters", type=int, default=3000, help="timed iterations per subject and cell")
    # NOTE: the bridge's Java calls take ~2.7x their steady time after 5000 calls on a loaded 2-core VM
    p.add_argument("--warmup", type=int, default=10000, help="untimed iterations per subject and cell, first")
    p.add_argument("--block", type=int, default=50, help="iterations per subject before switching")
    p.add_argument("--breakdown", action="store_true", help="also report the bridge's parts (plan, alloc, release)")
    p.add_argument("--json", help="write the cells as JSON to this path ('-': stdout, no table)")
    p.add_argument("--package-dir", help="import kvshield_sglang from this directory instead (a patched copy, to compare)")
    args = p.parse_args()
    if args.package_dir:
        sys.path.insert(0, os.path.abspath(args.package_dir))
    torch.set_num_threads(1)

    pools = [int(s) for s in args.pools.split(",")]
    tokens = [int(s) for s in args.tokens.split(",")]
    kinds = [("token", 1)] + ([("paged", args.paged_page_size)] if args.paged_page_size > 1 else [])
    table = args.json != "-"
    cells = []
    if table:
        print(f"level={args.level} iters={args.iters} warmup={args.warmup} block={args.block} torch={torch.__version__}"
              f" (per alloc+free of one request, microseconds; ratio = bridge / upstream)")
        head = (f"{'class':6} {'page':>4} {'pool':>7} {'tokens':>6} {'upstream med':>12} {'p90':>7} {'bridge med':>10}"
                f" {'p90':>7} {'ratio med':>9} {'ratio p90':>9}")
        if args.breakdown:
            head += f" {'plan':>6} {'alloc':>7} {'release':>7}"
        print(head, flush=True)
    for kind, page_size in kinds:
        for size in pools:
            upstream, bridge = build(kind, size, page_size, args.level)
            try:
                for n in tokens:
                    if n % page_size or n > size:
                        continue
                    up, br, parts = measure_cell(upstream, bridge, n, args.iters, args.warmup, args.block, args.breakdown)
                    um, u90 = _stats(up)
                    bm, b90 = _stats(br)
                    cell = {"class": kind, "page_size": page_size, "pool_tokens": size, "tokens": n,
                            "upstream_median_us": um, "upstream_p90_us": u90, "bridge_median_us": bm, "bridge_p90_us": b90,
                            "ratio_median": bm / um, "ratio_p90": b90 / u90, "samples": len(br)}
                    if parts is not None:
                        cell.update({"bridge_plan_median_us": _stats(parts[0])[0],
                                     "bridge_alloc_median_us": _stats(parts[1])[0],
                                     "bridge_release_median_us": _stats(parts[2])[0]})
                    cells.append(cell)
                    if table:
                        line = (f"{kind:6} {page_size:4d} {size:7d} {n:6d} {um:12.1f} {u90:7.1f} {bm:10.1f} {b90:7.1f}"
                                f" {bm / um:9.2f} {b90 / u90:9.2f}")
                        if parts is not None:
                            line += (f" {cell['bridge_plan_median_us']:6.1f} {cell['bridge_alloc_median_us']:7.1f}"
                                     f" {cell['bridge_release_median_us']:7.1f}")
                        print(line, flush=True)
                pool_cells = [c for c in cells if c["class"] == kind and c["pool_tokens"] == size]
                if table and len(pool_cells) > 1:
                    print(_per_token_line(pool_cells[0], pool_cells[-1]), flush=True)
            finally:
                bridge.close()
    doc = {"level": args.level, "iters": args.iters, "warmup": args.warmup, "block": args.block,
           "torch": torch.__version__, "cells": cells}
    if args.json == "-":
        json.dump(doc, sys.stdout, indent=1)
        print()
    elif args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
