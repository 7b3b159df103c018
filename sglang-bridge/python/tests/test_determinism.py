"""Tensor-parallel determinism: two ranks fed the same calls, one protecting asynchronously on a
slow backend, see the same available_size() and get the same slots at every call."""

import random
import time

from conftest import require_module
from fakes import FakeMHAPool

torch = require_module("torch")


def _rank(jvm, delayed):


    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    a = PagedTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", FakeMHAPool(64, 4), False, kvshield_settings={
        "level": "ZERO", "quarantine": "ASYNCHRONOUS" if delayed else "SYNCHRONOUS", "advertisedContextTokens": 64})
    return a


def test_same_calls_same_pages_with_delayed_protection(jvm):
    rng = random.Random(424242)
    ranks = [_rank(jvm, False), _rank(jvm, True)]
    live = []
    for step in range(60):
        for r in ranks:
            r.begin_step()
        if live and rng.random() < 0.45:
            victim = live.pop(rng.randrange(len(live)))
            for r in ranks:
                r.free(victim)
            time.sleep(0.001 * rng.random())  # rank timing differs; decisions must not
        else:
            n = 4 * rng.randint(1, 4)
            outs = [r.alloc(n) for r in ranks]
            assert (outs[0] is None) == (outs[1] is None), f"step {step}"
            if outs[0] is not None:
                assert outs[0].tolist() == outs[1].tolist(), f"step {step}"
                live.append(outs[0])
        assert ranks[0].available_size() == ranks[1].available_size(), f"step {step}"
