"""The prefix cache through the bridge on CPU: (1) the reclaim (ChaCha20 decrypt) cost per page of an
evicted prefix, against a resident hit of the same pages in the same run; (2) the page hit rate kept
under ENCRYPT vs ZERO (which loses every evicted prefix) on a seeded shared-prefix workload.

Needs a build (``mvn -pl sglang-bridge -am install``): the real sealer is tenant-keys' ChaCha20 over an
ephemeral root key (``dev.kvshield.bridge.ChaChaTestSealerFactory`` in the test classes).

Run: /usr/bin/python3 sglang-bridge/python/bench/bench_prefix.py [--reps N] [--warmup N] [--requests N] [--resident-cap P]
"""

import argparse
import glob
import os
import random
import statistics
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
SEALER = "dev.kvshield.bridge.ChaChaTestSealerFactory"
PAGE = 16


def _classpath():
    bc = sorted(glob.glob(os.path.expanduser("~/.m2/repository/org/bouncycastle/bcprov-jdk18on/*/bcprov-jdk18on-*.jar")))
    parts = [os.path.join(ROOT, "sglang-bridge", "target", "test-classes"),
             *glob.glob(os.path.join(ROOT, "tenant-keys", "target", "tenant-keys-*.jar")), *bc[-1:]]
    return os.pathsep.join(parts)


def _allocator(level, pages, layers):
    from fakes import FakeMHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.prefix_cache import KvShieldPrefixCache

    size = pages * PAGE
    kv = FakeMHAPool(size, PAGE, layers=layers, heads=2, head_dim=64)
    a = PagedTokenToKVPoolAllocator(size, PAGE, torch.float32, "cpu", kv, False, kvshield_settings={
        "level": level, "advertisedContextTokens": size, **({"sealerFactory": SEALER} if level == "ENCRYPT" else {})})
    return a, kv, KvShieldPrefixCache(a)


def _cache_request(a, cache, rid, tenant, tokens):
    """Admits a request: prefix hit, pages for the rest, finish into the cache, tail freed."""
    hit = cache.match_prefix(rid, tenant, tokens)
    m = hit.numel()
    a.set_plan([(rid, tenant, m, len(tokens))])
    new = a.alloc(-(-(len(tokens) - m) // PAGE) * PAGE)
    if new is None:
        cache.evict(len(tokens))
        a.end_step()
        new = a.alloc(-(-(len(tokens) - m) // PAGE) * PAGE)
    a.clear_plan()
    if new is None:
        cache.release(rid, tenant)
        return m, False
    slots = torch.cat([hit, new])
    full = len(tokens) // PAGE * PAGE
    cache.cache_finished_req(rid, tenant, tokens, slots[:len(tokens)])
    cache.release(rid, tenant)
    if full < len(new) + m:
        with a.releasing(tenant):
            a.free(slots[full:])
    a.end_step()
    return m, True


def reclaim_cost(reps, warmup, pages, layers):
    a, kv, cache = _allocator("ENCRYPT", pages * 2 + 4, layers)
    tokens = list(range(pages * PAGE))
    page_bytes = sum(b[0].numel() * b.element_size() for b in kv.k_buffer + kv.v_buffer) * PAGE
    _cache_request(a, cache, "warm", "t1", tokens)
    reclaim_ns, resident_ns = [], []
    for i in range(warmup + reps):
        cache.evict(pages * PAGE)
        a.end_step()
        t0 = time.perf_counter_ns()
        got = cache.match_prefix(f"r{i}", "t1", tokens)
        t1 = time.perf_counter_ns()
        assert got.numel() == pages * PAGE, "reclaim must hit every page"
        cache.release(f"r{i}", "t1")
        t2 = time.perf_counter_ns()
        again = cache.match_prefix(f"s{i}", "t1", tokens)
        t3 = time.perf_counter_ns()
        assert again.numel() == pages * PAGE
        cache.release(f"s{i}", "t1")
        if i >= warmup:  # NOTE: the JIT compiles the cipher during warm-up; time only warm runs
            reclaim_ns.append(t1 - t0)
            resident_ns.append(t3 - t2)
    rec, res = statistics.median(reclaim_ns) / pages, statistics.median(resident_ns) / pages
    print(f"reclaim through the bridge: {pages} pages of {page_bytes // 1024} KiB, {reps} reps after {warmup} warm-up"
          " (median per page)")
    print(f"  reclaimed (decrypt) hit  {rec / 1000:8.1f} us/page   {page_bytes / rec:6.2f} GB/s")
    print(f"  resident hit             {res / 1000:8.1f} us/page")
    print(f"  decrypt cost             {(rec - res) / 1000:8.1f} us/page   ({rec / res:.1f}x a resident hit, same run)")


def hit_rates(requests, pool_pages, cap, seed):
    rng_template = random.Random(seed)
    prompts = {t: [[rng_template.randrange(1, 30000) for _ in range(4 * PAGE)] for _ in range(4)] for t in ("t1", "t2", "t3", "t4")}
    results = {}
    for level in ("ZERO", "ENCRYPT"):
        rng = random.Random(seed)
        a, _, cache = _allocator(level, pool_pages, 2)
        matched = wanted = served = 0
        for i in range(requests):
            tenant = rng.choice(sorted(prompts))
            sys_prompt = rng.choice(prompts[tenant])
            tokens = sys_prompt + [rng.randrange(1, 30000) for _ in range(rng.randrange(PAGE, 3 * PAGE))]
            m, ok = _cache_request(a, cache, f"q{i}", tenant, tokens)
            matched += m // PAGE
            wanted += len(sys_prompt) // PAGE
            served += ok
            over = cache.stats()["resident_pages"] - cap
            if cap and over > 0:
                cache.evict(over * PAGE)
        s = cache.stats()
        results[level] = (matched / wanted, s, served)
    print(f"shared-prefix workload: {requests} requests, 4 tenants x 4 system prompts of 4 pages + 1-2 unique pages,"
          f" pool {pool_pages} pages, resident cap {cap or 'none (evict on demand)'}, seed {seed}")
    for level, (rate, s, served) in results.items():
        print(f"  {level:8s} prefix-page hit rate {100 * rate:5.1f}%  (reclaimed {s['reclaim_hits']}, gone {s['reclaim_gone']},"
              f" evictions {s['evictions']}, served {served})")
    return results


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--pages", type=int, default=32)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--pool-pages", type=int, default=96)
    p.add_argument("--resident-cap", type=int, default=24)
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args()
    os.environ["KVSHIELD_EXTRA_CLASSPATH"] = _classpath()
    from kvshield_sglang import runtime

    runtime.ensure_jvm()
    reclaim_cost(args.reps, args.warmup, args.pages, args.layers)
    hit_rates(args.requests, args.pool_pages, args.resident_cap, args.seed)
    hit_rates(args.requests, args.pool_pages, 0, args.seed)


if __name__ == "__main__":
    main()
