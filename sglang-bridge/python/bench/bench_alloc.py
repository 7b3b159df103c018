"""The bridge's cost per alloc and per free of 8 and 64 pages on CPU, side by side in one run with
SGLang's own ``PagedTokenToKVPoolAllocator`` (its bookkeeping: head slice of ``free_pages`` on alloc,
``torch.unique`` + ``torch.cat`` on free), and per request-level ``free_segment`` (SGLang:
stride slice + ``torch.cat``; the bridge: the request's page list, the slot tensor never read), and
per deferred free of device slots (the bridge: staging copy, queue, then resolution in one crossing;
here the copy is a host copy and the event free, so a GPU adds one cudaMemcpyAsync and one event).

Run: KVSHIELD_SGLANG_SOURCE=../shared/sglang-upstream /usr/bin/python3 sglang-bridge/python/bench/bench_alloc.py [--iters N] [--page-size P]
Reports the median and p90 per call in microseconds, and the bridge/baseline ratio (same run).
"""

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import sglang_source  # noqa: E402  (the real SGLang: installed, or KVSHIELD_SGLANG_SOURCE)

sglang_source.setup()
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator as SglangPaged  # noqa: E402


class StockAllocator(SglangPaged):
    """SGLang's own paged allocator (no KV memory attached: its bookkeeping alone), the yardstick."""

    def begin_step(self):
        pass


class _Unread:
    """A slot tensor as the bridge's request-level free_segment sees it: metadata only."""

    def __init__(self, t):
        self.dtype, self.device, self._n = t.dtype, torch.device("cuda", 0), t.numel()

    def numel(self):
        return self._n


class _DeviceSlots:
    """Slots as the bridge's deferred free sees device indices: metadata, and a non-blocking copy into
    the staging buffer (a host copy here, standing in for the device->host cudaMemcpyAsync)."""

    def __init__(self, t):
        self._t, self.dtype, self.device = t, t.dtype, torch.device("cuda", 0)

    def numel(self):
        return self._t.numel()

    def reshape(self, *shape):
        return self

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_:
            return args[0].copy_(args[1]._t)
        raise TypeError(f"{func.__name__} is not a device-side op here")


class _EventlessCuda:
    """The CUDA surface the deferred free uses, at no cost (no GPU here)."""

    class _Event:
        def record(self, stream):
            pass

        def synchronize(self):
            pass

    def Event(self):  # noqa: N802 (torch's name)
        return _EventlessCuda._Event()

    def current_stream(self, device=None):
        return None


def measure_deferred(alloc, pages, page_size, iters, warmup):
    """Median and p90 of a deferred free of device slots plus its resolution (allocation untimed)."""
    need = pages * page_size
    tf = []
    for i in range(iters + warmup):
        alloc.begin_step()
        x = alloc.alloc(need)
        t0 = time.perf_counter_ns()
        alloc.free(_DeviceSlots(x))
        alloc.resolve_frees()
        t1 = time.perf_counter_ns()
        if i >= warmup:
            tf.append((t1 - t0) / 1000)
    return statistics.median(tf), sorted(tf)[int(0.9 * len(tf))]


def measure_segment(alloc, pages, page_size, iters, warmup):
    """Median and p90 of a request's free_segment of its whole row (allocation untimed)."""
    need = pages * page_size
    ours = hasattr(alloc, "releasing")
    tf = []
    for i in range(iters + warmup):
        alloc.begin_step()
        if ours:
            alloc.set_plan([("req", "tenant", 0, need)])
        x = alloc.alloc(need)
        if ours:
            alloc.clear_plan()
            with alloc.releasing("tenant", "req"):
                t0 = time.perf_counter_ns()
                alloc.free_segment(_Unread(x), start_pos=0)
                t1 = time.perf_counter_ns()
        else:
            t0 = time.perf_counter_ns()
            alloc.free_segment(x, start_pos=0)
            t1 = time.perf_counter_ns()
        if i >= warmup:
            tf.append((t1 - t0) / 1000)
    return statistics.median(tf), sorted(tf)[int(0.9 * len(tf))]


def measure(alloc, pages, page_size, iters, warmup):
    need = pages * page_size
    ta, tf = [], []
    for i in range(iters + warmup):
        alloc.begin_step()
        t0 = time.perf_counter_ns()
        x = alloc.alloc(need)
        t1 = time.perf_counter_ns()
        alloc.free(x)
        t2 = time.perf_counter_ns()
        if i >= warmup:
            ta.append((t1 - t0) / 1000)
            tf.append((t2 - t1) / 1000)
    q = lambda v: (statistics.median(v), sorted(v)[int(0.9 * len(v))])  # noqa: E731
    return q(ta), q(tf)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=5000)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--pages", type=int, default=4096)
    p.add_argument("--levels", default="NONE,ZERO")
    args = p.parse_args()
    torch.set_num_threads(1)
    from fakes import MHAPool
    from kvshield_sglang import launch_fence
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    launch_fence.torch_cuda = _EventlessCuda

    size = args.pages * args.page_size
    # NOTE: a 4-byte-per-token KV (1 layer, K and V) keeps scrub cost out of the bookkeeping figures.
    kv = MHAPool(size, args.page_size, layers=1, heads=1, head_dim=1)
    subjects = [("SGLang's own paged allocator", StockAllocator(size, args.page_size, torch.float32, "cpu", None, False))]
    for level in args.levels.split(","):
        subjects.append((f"kvshield bridge, level {level}", PagedTokenToKVPoolAllocator(
            size, args.page_size, torch.float32, "cpu", kv, False,
            kvshield_settings={"level": level, "advertisedContextTokens": size})))
    print(f"page_size={args.page_size} pool={args.pages} pages iters={args.iters} torch={torch.__version__}"
          f" (median / p90 per call, microseconds)")
    print(f"{'subject':42} {'pages':>5} {'alloc med':>9} {'p90':>7} {'free med':>9} {'p90':>7} {'alloc x':>8} {'free x':>7}"
          f" {'segment med':>11} {'p90':>7} {'seg x':>6} {'deferred med':>12} {'p90':>7} {'def x':>6}")
    for pages in (8, 64):
        base = None
        for name, subject in subjects:
            (am, ap), (fm, fp) = measure(subject, pages, args.page_size, args.iters, args.warmup)
            sm, sp = measure_segment(subject, pages, args.page_size, args.iters, args.warmup)
            # NOTE: the baseline's free is its deferred-free yardstick too (SGLang frees device slots in place)
            dm, dp = measure_deferred(subject, pages, args.page_size, args.iters, args.warmup) if base else (fm, fp)
            if base is None:
                base = (am, fm, sm, dm)
            print(f"{name:42} {pages:5d} {am:9.2f} {ap:7.2f} {fm:9.2f} {fp:7.2f} {am / base[0]:8.2f} {fm / base[1]:7.2f}"
                  f" {sm:11.2f} {sp:7.2f} {sm / base[2]:6.2f} {dm:12.2f} {dp:7.2f} {dm / base[3]:6.2f}")


if __name__ == "__main__":
    main()
