"""The ``kvshield`` radix-cache backend on CPU, driven the way SGLang's scheduler drives it: (1) the reclaim (ChaCha20 decrypt) cost per page of an
evicted prefix, against a resident hit of the same pages in the same run; (2) the page hit rate kept
under ENCRYPT vs ZERO (which loses every evicted prefix) on a seeded shared-prefix workload.

Needs a build (``mvn -pl sglang-bridge -am package``): the real sealer is tenant-keys' ChaCha20 over an
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


HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import sglang_source  # noqa: E402  (the real SGLang: installed, or KVSHIELD_SGLANG_SOURCE)

sglang_source.setup()
from sglang.srt.mem_cache.base_prefix_cache import EvictParams  # noqa: E402

SEALER = "dev.kvshield.bridge.ChaChaTestSealerFactory"
PAGE = 16


def _classpath():
    bc = sorted(glob.glob(os.path.expanduser("~/.m2/repository/org/bouncycastle/bcprov-jdk18on/*/bcprov-jdk18on-*.jar")))
    parts = [os.path.join(ROOT, "sglang-bridge", "target", "test-classes"),
             *glob.glob(os.path.join(ROOT, "tenant-keys", "target", "tenant-keys-*.jar")), *bc[-1:]]
    return os.pathsep.join(parts)


def _engine(level, pages, layers):
    from prefix_driver import Engine
    from kvshield_sglang.prefix_cache import KvShieldPrefixCache

    return Engine(lambda params, shared: KvShieldPrefixCache(params, shared), level=level, size=pages * PAGE, page=PAGE,
                  sealer=SEALER if level == "ENCRYPT" else None, layers=layers, heads=2, head_dim=64)


def reclaim_cost(reps, warmup, pages, layers):
    """Median per-page time of a match through the backend that reclaims (decrypts) an evicted prefix,
    against a match of the same prefix resident, same run."""
    from prefix_driver import Req

    e = _engine("ENCRYPT", pages * 2 + 4, layers)
    tokens = list(range(pages * PAGE))
    page_bytes = sum(b[0].numel() * b.element_size() for b in e.kv.k_buffer + e.kv.v_buffer) * PAGE
    assert e.run(Req("warm", "t1", tokens + [0])) is not None
    reclaim_ns, resident_ns = [], []
    for i in range(warmup + reps):
        e.cache.evict(EvictParams(num_tokens=pages * PAGE))
        e.alloc.end_step()
        t0 = time.perf_counter_ns()
        got = e.match(Req(f"r{i}", "t1", tokens))
        t1 = time.perf_counter_ns()
        assert got.numel() == pages * PAGE, "reclaim must hit every page"
        again = e.match(Req(f"s{i}", "t1", tokens))
        t2 = time.perf_counter_ns()
        assert again.numel() == pages * PAGE
        if i >= warmup:  # NOTE: the JIT compiles the cipher during warm-up; time only warm runs
            reclaim_ns.append(t1 - t0)
            resident_ns.append(t2 - t1)
    rec, res = statistics.median(reclaim_ns) / pages, statistics.median(resident_ns) / pages
    print(f"reclaim through the radix-cache backend: {pages} pages of {page_bytes // 1024} KiB, {reps} reps after"
          f" {warmup} warm-up (median per page)")
    print(f"  reclaimed (decrypt) hit  {rec / 1000:8.1f} us/page   {page_bytes / rec:6.2f} GB/s")
    print(f"  resident hit             {res / 1000:8.1f} us/page")
    print(f"  decrypt cost             {(rec - res) / 1000:8.1f} us/page   ({rec / res:.1f}x a resident hit, same run)")


def hit_rates(requests, pool_pages, cap, seed):
    """Prefix-page hit rate of a seeded shared-prefix workload (each tenant reuses its own system
    prompts) driven through the backend, under ZERO and ENCRYPT, evicting down to ``cap`` resident
    pages after each request (0: evict on demand only)."""
    from prefix_driver import Req

    rng_template = random.Random(seed)
    prompts = {t: [[rng_template.randrange(1, 30000) for _ in range(4 * PAGE)] for _ in range(4)] for t in ("t1", "t2", "t3", "t4")}
    results = {}
    for level in ("ZERO", "ENCRYPT"):
        rng = random.Random(seed)
        e = _engine(level, pool_pages, 2)
        matched = wanted = served = 0
        for i in range(requests):
            tenant = rng.choice(sorted(prompts))
            sys_prompt = rng.choice(prompts[tenant])
            req = Req(f"q{i}", tenant, sys_prompt + [rng.randrange(1, 30000) for _ in range(rng.randrange(PAGE, 3 * PAGE))])
            ok = e.run(req, chunk=2 * PAGE) is not None
            matched += min(req.matched_tokens, len(sys_prompt)) // PAGE if ok else 0
            wanted += len(sys_prompt) // PAGE
            served += ok
            over = e.cache.stats()["resident_pages"] - cap
            if cap and over > 0:
                e.cache.evict(EvictParams(num_tokens=over * PAGE))
                e.alloc.end_step()
        s = e.cache.stats()
        results[level] = (matched / wanted, s, served)
    print(f"shared-prefix workload: {requests} requests, 4 tenants x 4 system prompts of 4 pages + 1-2 unique pages,"
          f" chunked prefill of 2 pages, pool {pool_pages} pages, resident cap {cap or 'none (evict on demand)'}, seed {seed}")
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
