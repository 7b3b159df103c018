"""Page ids travel host-side: ``alloc_extend``/``alloc_decode`` and a request's ``free_segment`` read
no device tensor (SGLang's own allocator does not sync there either). Index tensors are
DeviceOnlyTensor, which raises on any host read; the twins show the detector fires where the
bridge must fall back to the device values."""

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, DeviceToHostCopy, FakeMHAPool

torch = require_module("torch")
SETTINGS = {"level": "ZERO", "advertisedContextTokens": 64, "strict": True}


def _paged():
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", FakeMHAPool(32, 4), False, kvshield_settings=SETTINGS)


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


def test_twin_free_segment_outside_a_request_release_must_read_the_slots(jvm):
    a = _paged()
    row = _extend(a, True, "A", 0, 8, -1)
    with pytest.raises(DeviceToHostCopy):  # e.g. radix-cache eviction: no request names the pages
        a.free_segment(DeviceOnlyTensor(row), start_pos=0)
    assert a.page_owner(1)[0] == "t1"


def test_token_allocator_request_release_reads_nothing_from_the_device(jvm):
    from kvshield_sglang.allocator import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(16, torch.float32, "cpu", FakeMHAPool(16, 1), False, kvshield_settings=SETTINGS)
    a.set_plan([("A", "t1", 0, 5)])
    row = a.alloc(5).tolist()
    a.set_plan([("A", "t1", 5, 6)])  # a decode step
    row += a.alloc(1).tolist()
    a.clear_plan()
    with a.releasing("t1", "A"):
        a.free_segment(DeviceOnlyTensor(row[2:]), start_pos=2)  # SGLang's token free never syncs either
    assert [a.page_owner(s)[0] for s in row] == ["t1", "t1", None, None, None, None]
    assert a.host_syncs() == 0
