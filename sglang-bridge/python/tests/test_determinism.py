"""Tensor-parallel determinism: two ranks fed the same calls, one protecting asynchronously on a
slow backend, see the same available_size() and get the same slots at every call, also when frees
of device indices are deferred (resolved where the calls say, never by timing)."""

import random
import time

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, MHAPool, install_fake_cuda

torch = require_module("torch")


def _rank(jvm, delayed):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    a = PagedTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", MHAPool(64, 4), False, kvshield_settings={
        "level": "ZERO", "quarantine": "ASYNCHRONOUS" if delayed else "SYNCHRONOUS", "advertisedContextTokens": 64})
    return a


@pytest.mark.parametrize("device_frees", [False, True])
def test_same_calls_same_pages_with_delayed_protection(jvm, monkeypatch, device_frees):
    cuda = install_fake_cuda(monkeypatch)
    rng = random.Random(424242)
    ranks = [_rank(jvm, False), _rank(jvm, True)]
    live = []
    for step in range(60):
        for r in ranks:
            r.begin_step()
        for op in range(rng.randint(1, 3)):  # several calls a step: frees then allocations before the boundary
            where = f"step {step} call {op}"
            if live and rng.random() < 0.45:
                victim = live.pop(rng.randrange(len(live)))
                for r in ranks:
                    r.free(DeviceOnlyTensor(victim.tolist()) if device_frees else victim)
                time.sleep(0.001 * rng.random())  # rank timing differs; decisions must not
            else:
                n = 4 * rng.randint(1, 4)
                outs = [r.alloc(n) for r in ranks]
                assert (outs[0] is None) == (outs[1] is None), where
                if outs[0] is not None:
                    assert outs[0].tolist() == outs[1].tolist(), where
                    live.append(outs[0])
            assert ranks[0].available_size() == ranks[1].available_size(), where
            assert ranks[0].pending_frees() == ranks[1].pending_frees(), where
    assert len({s for t in live for s in t.tolist()}) == sum(t.numel() for t in live)  # no slot handed out twice
    waits = [op for op in cuda.log if op[0] == "synchronize"]
    assert bool(waits) == device_frees and all(r.host_syncs() == 0 for r in ranks)
