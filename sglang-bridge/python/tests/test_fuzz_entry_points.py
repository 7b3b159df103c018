"""Hostile calls on every allocator entry point (seeded): random and boundary sizes, wrong dtypes and
shapes, out-of-range, stale, foreign and garbage slot indices, malformed plans and tenant names.
Each call succeeds or fails with a clear message; a call that fails, or whose frees were all
rejected, leaves the pool's state digest exactly as it was; slots handed out never overlap the
slots the model says are live."""

import random

import pytest

from conftest import require_module
from fakes import MHAPool

torch = require_module("torch")

SEED = 17
CALLS = 300
PAGE = 4
SIZE = 32
SETTINGS = {"level": "ZERO", "advertisedContextTokens": SIZE}
SIZES = [-(2 ** 63), -5, -1, 0, 1, 3, 4, 8, 12, 31, 32, 33, 36, 2 ** 31, 2 ** 63 - 1, 4.0, 4.5, "8", "x", None, float("nan")]
DTYPES = [torch.int64, torch.int32, torch.int16, torch.float32, torch.float64, torch.bool, torch.uint8]
NAMES = ["t1", "t2", "", "t1" * 200, "\u00e9", None, 3]


def _allocator(jvm, strict):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    s = dict(SETTINGS, strict=strict)
    return PagedTokenToKVPoolAllocator(SIZE, PAGE, torch.float32, "cpu", MHAPool(SIZE, PAGE), False,
                                       kvshield_settings=s)


def _digest(a):
    return int(a._j.pool().stateDigest())


def _garbage_slots(rnd, live):
    kind = rnd.randrange(6)
    if kind == 0:
        return torch.tensor([rnd.choice([-1, -(2 ** 40), SIZE + PAGE, 2 ** 40])], dtype=torch.int64)  # out of range
    if kind == 1:
        return torch.tensor([0, 1, 2, 3], dtype=torch.int64)  # page 0 is reserved
    if kind == 2:
        dead = [s for s in range(PAGE, SIZE + PAGE) if s not in live]
        return torch.tensor(rnd.sample(dead, min(len(dead), 1 + rnd.randrange(4))) or [PAGE], dtype=torch.int64)  # stale
    if kind == 3:
        return torch.rand(3) * SIZE  # float dtype
    if kind == 4:
        return torch.zeros((SIZE * 4,), dtype=torch.int64)  # more slots than the pool
    return torch.tensor([[PAGE, PAGE + 1]], dtype=rnd.choice(DTYPES))  # wrong shape or dtype


@pytest.mark.parametrize("strict", [False, True])
def test_hostile_calls_change_nothing_when_rejected(jvm, strict):
    from kvshield_sglang.errors import KvShieldError

    rnd = random.Random(SEED)
    a = _allocator(jvm, strict)
    a.tenant_id("t1")  # registering a tenant changes the digest: do it before any comparison
    a.tenant_id("t2")
    live = {}  # slot -> tenant of slots the model says are allocated
    clear_errors = (KvShieldError, TypeError, ValueError, NotImplementedError)
    rejected_calls = 0
    for i in range(CALLS):
        op = rnd.randrange(8)
        before = _digest(a)
        rejected_before = a.rejected_frees()
        try:
            if op == 0:
                n = rnd.choice(SIZES)
                tenant = rnd.choice(["t1", "t2"])
                a.set_plan([(f"r{i}", tenant, 0, n if isinstance(n, int) and 0 < n <= SIZE else PAGE)])
                got = a.alloc(n)
                a.clear_plan()
                if got is not None and got.numel():
                    slots = got.tolist()
                    assert not set(slots) & set(live), f"call {i}: alloc({n!r}) handed out live slots {slots}"
                    for s in slots:
                        live[s] = tenant
            elif op == 1 and live:
                tenant = rnd.choice(sorted(set(live.values())))
                mine = [s for s, t in live.items() if t == tenant]
                page = rnd.choice(mine) // PAGE
                idx = torch.arange(page * PAGE, page * PAGE + PAGE, dtype=rnd.choice([torch.int64, torch.int32]))
                with a.releasing(tenant):
                    a.free(idx)
                for s in idx.tolist():
                    live.pop(s, None)
            elif op == 2:
                idx = _garbage_slots(rnd, live)
                with a.releasing(rnd.choice(["t1", "t2"])):
                    a.free(idx)
                if a.rejected_frees() == rejected_before:
                    # Nothing was rejected: the indices named live pages of that tenant after all.
                    for s in list(live):
                        if s // PAGE in {int(x) // PAGE for x in idx.reshape(-1).tolist()}:
                            live.pop(s)
                    continue
                assert _digest(a) == before, f"call {i}: a free whose pages were all rejected changed the pool"
                rejected_calls += 1
                continue
            elif op == 3 and live:
                # A foreign free: the other tenant releases a live page.
                s, t = rnd.choice(sorted(live.items()))
                other = "t2" if t == "t1" else "t1"
                with a.releasing(other):
                    a.free(torch.tensor([s], dtype=torch.int64))
                assert _digest(a) == before, f"call {i}: a foreign free changed the pool"
                assert a.rejected_frees() == rejected_before + 1
                rejected_calls += 1
                continue
            elif op == 4:
                # An unaligned segment frees the page its slot is on, as SGLang's free_segment does.
                slot = rnd.choice(sorted(live)) if live and rnd.random() < 0.5 else PAGE + 1
                a.free_segment(torch.tensor([slot], dtype=torch.int64), start_pos=rnd.choice([1, 2, 3, 5]))
                if a.rejected_frees() == rejected_before:
                    for s in [s for s in live if s // PAGE == slot // PAGE]:
                        live.pop(s)
                else:
                    assert _digest(a) == before, f"call {i}: a rejected segment free changed the pool"
            elif op == 5:
                a.tenant_id(rnd.choice(NAMES))
            elif op == 6:
                a.page_owner(rnd.choice([-1, 0, SIZE // PAGE, SIZE // PAGE + 1, 2 ** 31 - 1]))
            else:
                a.end_step()
        except clear_errors as e:
            assert str(e), f"call {i} (op {op}) failed without a message: {type(e).__name__}"
            assert "Traceback" not in str(e)
            assert _digest(a) == before, f"call {i} (op {op}) failed with {e!r} and changed the pool"
            rejected_calls += 1
    assert rejected_calls > CALLS // 5, f"too few hostile calls were rejected: {rejected_calls}"
    a.close()
