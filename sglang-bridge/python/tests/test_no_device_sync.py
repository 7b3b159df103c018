"""Page ids travel host-side: ``alloc_extend``/``alloc_decode`` and a request's ``free_segment`` read
no device tensor, and no free path blocks on the device: frees nothing host-side names are deferred
(a non-blocking copy, an event, resolution at deterministic points). Index tensors are
DeviceOnlyTensor, which raises on any blocking host read and delivers a non-blocking copy only when
an event after it is synchronized; FakeCuda's events raise when polled. The twins show the detectors
fire: where the bridge must read the device, with a blocking staging copy, and without the wait."""

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, DeviceToHostCopy, MHAPool, install_fake_cuda

torch = require_module("torch")
SETTINGS = {"level": "ZERO", "advertisedContextTokens": 64, "strict": True}


@pytest.fixture(autouse=True)
def cuda(monkeypatch):
    return install_fake_cuda(monkeypatch)


def _paged():
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", MHAPool(32, 4), False, kvshield_settings=SETTINGS)


def _extend(a, device, rid, prefix, seq, last_loc):
    a.set_plan([(rid, "t1", prefix, seq)])
    wrap = DeviceOnlyTensor if device else torch.tensor
    out = a.alloc_extend(wrap([prefix]), torch.tensor([prefix]), wrap([seq]), torch.tensor([seq]), wrap([last_loc]),
                         seq - prefix)
    a.clear_plan()
    return out.tolist()


def _decode(a, device, rid, seq, last_loc):
    a.set_plan([(rid, "t1", seq - 1, seq)])
    wrap = DeviceOnlyTensor if device else torch.tensor
    out = a.alloc_decode(wrap([seq]), torch.tensor([seq]), wrap([last_loc]))
    a.clear_plan()
    return out.tolist()


def _schedule(device):
    """A chunked prefill, decodes across a page boundary, then the request's release."""
    a = _paged()
    row = _extend(a, device, "A", 0, 6, -1)
    row += _extend(a, device, "A", 6, 9, row[-1])
    for seq in (10, 11, 12, 13):
        row += _decode(a, device, "A", seq, row[-1])
    owned = [a.page_owner(s // 4)[0] for s in row[::4]]
    with a.releasing("t1", "A"):
        wrap = DeviceOnlyTensor if device else torch.tensor
        a.free_segment(wrap(row[8:]), start_pos=8)
        a.free_segment(wrap(row[:8]), start_pos=0)
    return a, row, owned


def test_extend_decode_and_release_read_nothing_from_the_device_and_match_the_host_path(jvm):
    a, row, owned = _schedule(device=True)
    ref, ref_row, ref_owned = _schedule(device=False)
    assert row == ref_row == [4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]
    assert owned == ref_owned == ["t1"] * 4
    assert [a.page_owner(p) for p in range(1, 6)] == [(None, -1)] * 5
    assert a.available_size() == ref.available_size() and a.rejected_frees() == ref.rejected_frees() == 0
    assert a.host_syncs() == 0


def test_free_segment_in_a_free_group_reads_nothing_from_the_device(jvm):
    a = _paged()
    row = _extend(a, True, "A", 0, 8, -1)
    a.free_group_begin()
    with a.releasing("t1", "A"):
        a.free_segment(DeviceOnlyTensor(row), start_pos=0)
    a.free_group_end()
    assert a.page_owner(1) == (None, -1) and a.host_syncs() == 0


def test_twin_unattributed_decode_must_read_last_loc_from_the_device(jvm):
    a = _paged()
    _extend(a, True, "A", 0, 6, -1)
    with pytest.raises(DeviceToHostCopy):  # no plan rows: nothing host-side names the partial page
        a.alloc_decode(DeviceOnlyTensor([7]), torch.tensor([7]), DeviceOnlyTensor([9]))


def test_eviction_free_is_deferred_without_a_sync_and_resolved_at_the_step_boundary(jvm, cuda):
    a = _paged()
    row = _extend(a, True, "A", 0, 8, -1)
    a.cache_took("A", "t1")  # A finished; SGLang's radix tree kept its pages
    before = a.available_size()
    with a.evicting():
        a.free_segment(DeviceOnlyTensor(row), start_pos=0)  # radix-cache eviction: no request names the pages
    assert a.pending_frees() == 1 and a.page_owner(1) == ("t1", -1)  # still the cache's: nothing reached the pool
    assert a.available_size() == before + 8  # counted from numel(), host-side
    assert not [op for op in cuda.log if op[0] == "synchronize"]
    a.begin_step()
    assert a.pending_frees() == 0 and a.page_owner(1) == (None, -1) and a.page_owner(2) == (None, -1)
    assert a.available_size() == before + 8 and a.host_syncs() == 0
    assert [op[0] for op in cuda.log] == ["record", "synchronize"]


class _BlockingStaging:  # planted bug: the staging copy waits for the device
    def _stage_from_device(self, dst, free_index):
        dst.copy_(free_index.reshape(-1))


class _UnfencedStaging:  # planted bug: no event after the copy, so resolution reads the staging buffer unwaited
    def _stage_from_device(self, dst, free_index):
        dst.copy_(free_index.reshape(-1), non_blocking=True)


def _planted(bug):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    cls = type("Planted", (bug, PagedTokenToKVPoolAllocator), {})
    return cls(32, 4, torch.float32, "cpu", MHAPool(32, 4), False, kvshield_settings=SETTINGS)


def test_twin_a_blocking_staging_copy_is_caught(jvm):
    a = _planted(_BlockingStaging)
    row = _extend(a, True, "A", 0, 8, -1)
    a.cache_took("A", "t1")
    with pytest.raises(DeviceToHostCopy), a.evicting():
        a.free(DeviceOnlyTensor(row))


def test_twin_resolving_without_waiting_for_the_copy_reads_garbage(jvm):
    from kvshield_sglang.errors import KvShieldError

    a = _planted(_UnfencedStaging)
    row = _extend(a, True, "A", 0, 8, -1)
    a.cache_took("A", "t1")
    with a.evicting():
        a.free(DeviceOnlyTensor(row))
    with pytest.raises(KvShieldError, match="free of slot -7"):
        a.begin_step()
    assert a.page_owner(1) == ("t1", -1)  # still the cache's: the garbage free released nothing


def test_token_allocator_device_frees_and_free_groups_never_sync(jvm):
    from kvshield_sglang.allocator import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(16, torch.float32, "cpu", MHAPool(16, 1), False, kvshield_settings=SETTINGS)
    a.set_plan([("A", "t1", 0, 6)])
    x = a.alloc(6).tolist()
    a.clear_plan()
    with a.releasing("t1", "A"):
        a.free(DeviceOnlyTensor(x[:2], dtype=torch.int32))  # SGLang frees int32 req_to_token slices
    assert a.available_size() == 12  # counted at once, host-side
    a.free_group_begin()
    with a.releasing("t1", "A"):
        a.free(DeviceOnlyTensor(x[2:4]))
        a.free(DeviceOnlyTensor(x[4:5]))
    a.free_group_end()  # queued behind the group's frees, still on the device
    assert a.available_size() == 15  # the group's frees count once it ended, host-side
    assert a.pending_frees()
    assert [a.page_owner(s) for s in x] == [("t1", a.request_id("A"))] * 6  # none reached the pool
    a.end_step()
    assert [a.page_owner(s) for s in x] == [(None, -1)] * 5 + [("t1", a.request_id("A"))]
    assert a.available_size() == 15 and a.host_syncs() == 0 and a.rejected_frees() == 0


def test_token_allocator_request_release_reads_nothing_from_the_device(jvm):
    from kvshield_sglang.allocator import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(16, torch.float32, "cpu", MHAPool(16, 1), False, kvshield_settings=SETTINGS)
    a.set_plan([("A", "t1", 0, 5)])
    row = a.alloc(5).tolist()
    a.set_plan([("A", "t1", 5, 6)])  # a decode step
    row += a.alloc(1).tolist()
    a.clear_plan()
    with a.releasing("t1", "A"):
        a.free_segment(DeviceOnlyTensor(row[2:]), start_pos=2)  # SGLang's token free never syncs either
    assert [a.page_owner(s)[0] for s in row] == ["t1", "t1", None, None, None, None]
    assert a.host_syncs() == 0


def _full_pool():
    """A and B hold every page (16 tokens each)."""
    a = _paged()
    rows = {rid: _extend(a, True, rid, 0, 16, -1) for rid in ("A", "B")}
    assert a.available_size() == 0
    return a, rows


@pytest.mark.parametrize("how", ["alloc", "alloc_extend"])
def test_evict_then_allocate_in_one_step(jvm, how):
    a, rows = _full_pool()
    a.cache_took("A", "t1")
    a.begin_step()
    with a.evicting():
        a.free_segment(DeviceOnlyTensor(rows["A"]), start_pos=0)  # the scheduler evicts, then checks and allocates
    assert a.available_size() == 16 and a.pending_frees() == 1
    if how == "alloc":
        a.set_plan([("C", "t1", 0, 16)])
        out = a.alloc(16).tolist()
        a.clear_plan()
    else:
        out = _extend(a, True, "C", 0, 16, -1)
    assert sorted(out) == sorted(rows["A"])  # resolved on demand: the evicted pages, nothing else
    assert a.pending_frees() == 0 and a.available_size() == 0 and a.host_syncs() == 0
    assert {a.page_owner(s // 4) for s in out} == {("t1", a.request_id("C"))}


def test_a_page_freed_while_deferred_is_never_handed_out_twice(jvm):
    a = _paged()
    ra = _extend(a, True, "A", 0, 8, -1)
    a.cache_took("A", "t1")
    with a.evicting():
        a.free(DeviceOnlyTensor(ra))
    assert a.available_size() == 32 and a.pending_frees() == 1
    first = a.alloc(24).tolist()  # the pool's own free pages suffice: the deferred ones stay the cache's
    assert not set(first) & set(ra) and a.pending_frees() == 1
    second = a.alloc(8).tolist()  # only the deferred pages are left: resolved now
    assert sorted(second) == sorted(ra) and a.pending_frees() == 0
    assert a.alloc(4) is None and a.available_size() == 0
    assert len(set(first + second)) == 32


def test_staging_overflow_resolves_first_at_a_point_fixed_by_the_sizes(jvm, cuda):
    from kvshield_sglang.allocator import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(16, torch.float32, "cpu", MHAPool(16, 1), False,
                               kvshield_settings=dict(SETTINGS, strict=False))
    x = a.alloc(16).tolist()
    pending = []
    # Valid frees never fill the staging buffer (the pool's 17 slots); a repeated one can.
    for part in (x[:6], x[6:12], x[:6]):
        a.free(DeviceOnlyTensor(part))
        pending.append((a.pending_frees(), a.rejected_frees()))
    assert pending == [(1, 0), (2, 0), (1, 0)]  # the third did not fit beside two: those two resolved first
    assert [a.page_owner(s)[0] for s in x] == [None] * 12 + ["default"] * 4
    a.end_step()
    assert a.rejected_frees() == 6 and a.available_size() == 12
    assert [op[0] for op in cuda.log].count("synchronize") == 3 and a.host_syncs() == 0


@pytest.mark.parametrize("end", ["clear", "close"])
def test_clear_and_close_resolve_the_pending_frees_first(jvm, cuda, end):
    a, rows = _full_pool()
    a.cache_took("A", "t1")
    with a.evicting():
        a.free(DeviceOnlyTensor(rows["A"]))
    getattr(a, end)()  # the pending free goes first: releaseAll then finds its pages already free
    assert [op[0] for op in cuda.log] == ["record", "synchronize"]
    if end == "clear":
        assert a.pending_frees() == 0 and a.rejected_frees() == 0
        a.end_step()
        assert a.available_size() == 32
