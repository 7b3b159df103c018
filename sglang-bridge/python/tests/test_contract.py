"""SGLang's allocator contract on tiny CPU pools (SGLang's own KV pool classes), for kvshield's classes
subclassing SGLang's own."""

import random
import struct

import pytest

from conftest import require_module
from fakes import MHAPool, MLAPool, ref_alloc_extend

torch = require_module("torch")

SETTINGS = {"level": "ZERO", "advertisedContextTokens": 64}


def _classes():
    from kvshield_sglang import allocator

    return allocator


@pytest.fixture
def flavor(jvm):
    """The allocator classes (they subclass SGLang's own)."""
    return "upstream"


def token_alloc(size=16, settings=None, kv=None):
    a = _classes()
    return a.TokenToKVPoolAllocator(size, torch.float32, "cpu", kv or MHAPool(size, 1), False,
                                    kvshield_settings=settings or SETTINGS)


def paged_alloc(size=32, page_size=4, settings=None, kv=None):
    a = _classes()
    return a.PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", kv or MHAPool(size, page_size), False,
                                         kvshield_settings=settings or SETTINGS)


def test_token_alloc_exact_slots_and_oom(flavor):
    a = token_alloc(16)
    assert a.available_size() == 16
    x = a.alloc(5)
    assert x.dtype == torch.int64 and x.device.type == "cpu"
    assert x.tolist() == [1, 2, 3, 4, 5]
    assert a.alloc(11).tolist() == list(range(6, 17))
    assert a.available_size() == 0
    assert a.alloc(1) is None
    assert a.alloc(0).numel() == 0


def test_token_free_then_reuse_in_freed_order(flavor):
    a = token_alloc(8)
    x = a.alloc(6)
    a.free(x[2:4])
    assert a.available_size() == 4  # queued for protection counts as available
    a.end_step()
    assert a.alloc(2).tolist() == [3, 4]
    assert a.available_size() == 2


def test_paged_alloc_whole_pages_slot0_reserved(flavor):
    a = paged_alloc(16, 4)
    assert a.available_size() == 16
    assert a.num_pages == 4
    x = a.alloc(8)
    assert x.tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert a.alloc(12) is None
    y = a.alloc(8)
    assert y.tolist() == list(range(12, 20))
    assert all(s >= 4 for s in x.tolist() + y.tolist())  # page 0 (slots 0..3) never handed out
    assert a.alloc(4) is None
    with pytest.raises(Exception, match="multiple of page_size 4"):
        a.alloc(6)


def test_free_groups_batch_and_refuse_nesting(flavor):
    a = paged_alloc(16, 4)
    a.set_plan([("A", "t1", 0, 16)])
    x = a.alloc(16)
    a.clear_plan()
    a.free_group_begin()  # SGLang releases the requests that finished in a step inside one group
    with a.releasing("t1", "A"):
        a.free(x[:4])
        a.free(x[8:12])
    assert a.available_size() == 0  # held until the group ends
    assert a.page_owner(int(x[0]) // 4)[0] == "t1" and a.page_owner(int(x[8]) // 4)[0] == "t1"
    with pytest.raises(Exception, match="nested"):
        a.free_group_begin()
    a.free_group_end()
    assert a.available_size() == 8
    held = ("t1", a.request_id("A"))
    assert [a.page_owner(int(s) // 4) for s in x[::4]] == [(None, -1), held, (None, -1), held]
    a.end_step()
    assert a.alloc(8).tolist() == x[:4].tolist() + x[8:12].tolist()


def test_free_pages_len_clear_and_kvcache(flavor):
    kv = MHAPool(16, 4)
    a = paged_alloc(16, 4, kv=kv)
    assert a.get_kvcache() is kv
    a.alloc(8)
    assert len(a.free_pages) == 2
    a.clear()
    assert a.available_size() == 16
    assert a.alloc(16) is not None


def test_token_allocator_has_no_paged_calls(flavor):
    a = token_alloc(8)
    with pytest.raises(NotImplementedError):
        a.alloc_decode(torch.tensor([2]), torch.tensor([2]), torch.tensor([1]))


def test_mla_latent_buffers(flavor):
    a = paged_alloc(16, 4, kv=MLAPool(16, 4))
    assert a.alloc(4).tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("page_size", [2, 4, 8])
def test_alloc_extend_and_decode_match_reference(flavor, page_size):
    rng = random.Random(20260 + page_size)
    size = 64 * page_size
    a = paged_alloc(size, page_size)
    next_page = 1  # a fresh pool without frees hands pages out in order
    reqs = []  # (seq_len, last slot) per live request
    for step in range(12):
        a.begin_step()
        if not reqs or rng.random() < 0.5:
            bs = rng.randint(1, 3)
            prefix = [0] * bs
            seq = [rng.randint(1, 3 * page_size) for _ in range(bs)]
            last = [-1] * bs
            ext = sum(seq)
            free_pages = list(range(next_page, next_page + 3 * bs + 3))
            expect, used = ref_alloc_extend(prefix, seq, last, free_pages, page_size)
            out = a.alloc_extend(torch.tensor(prefix), torch.tensor(prefix), torch.tensor(seq), torch.tensor(seq),
                                 torch.tensor(last), ext)
            assert out.tolist() == expect, f"step {step} seed {20260 + page_size}"
            next_page += used
            pos = 0
            for s in seq:
                pos += s
                reqs.append((s, out[pos - 1].item()))
        else:
            seq = [s + 1 for s, _ in reqs]
            last = [l for _, l in reqs]
            free_pages = list(range(next_page, next_page + len(reqs) + 1))
            expect, used = ref_alloc_extend([s - 1 for s in seq], seq, last, free_pages, page_size)
            out = a.alloc_decode(torch.tensor(seq), torch.tensor(seq), torch.tensor(last))
            assert out.tolist() == expect, f"step {step} seed {20260 + page_size}"
            next_page += used
            reqs = [(s, o) for s, o in zip(seq, out.tolist())]
        assert a.available_size() == (size // page_size - (next_page - 1)) * page_size


def test_alloc_extend_out_of_memory_is_none_and_changes_nothing(flavor):
    a = paged_alloc(8, 4)
    before = a.available_size()
    out = a.alloc_extend(torch.tensor([0]), torch.tensor([0]), torch.tensor([9]), torch.tensor([9]), torch.tensor([-1]), 9)
    assert out is None
    assert a.available_size() == before
    assert a.alloc(8).tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_plan_attributes_pages_and_mismatch_goes_to_default_tenant(flavor):
    a = token_alloc(16)
    a.set_plan([("r1", "acme", 0, 2), ("r2", "globex", 3, 5)])
    assert a.alloc(4).tolist() == [1, 2, 3, 4]
    assert [a.page_owner(p)[0] for p in (1, 2, 3, 4)] == ["acme", "acme", "globex", "globex"]
    assert a.page_owner(3)[1] == a.request_id("r2")
    assert a.alloc(3).tolist() == [5, 6, 7]  # the plan covers 4 slots, not 3: unattributed
    assert a.page_owner(5) == ("default", -1)
    a.clear_plan()


def test_a_plan_that_raises_leaves_the_plan_unchanged_even_when_it_needs_more_room(flavor):
    a = token_alloc(16)
    a.set_plan([("r1", "acme", 0, 2)])
    rows = [(f"q{i}", "globex", 0, 1) for i in range(300)]  # more rows than the plan buffer holds
    with pytest.raises(ValueError):
        a.set_plan(rows + [("bad", "globex", "x", 1)])
    assert a.alloc(2).tolist() == [1, 2]
    assert [a.page_owner(p) for p in (1, 2)] == [("acme", a.request_id("r1"))] * 2
    with pytest.raises(struct.error):
        a.set_plan(rows + [("big", "globex", 0, 1 << 63)])  # outside int64: no plan, never a half-written one
    assert a.alloc(1).tolist() == [3]
    assert a.page_owner(3) == ("default", -1)


def _retract_and_resume(a, kv):
    """SGLang's retraction with CPU offload: a request's KV copied to host memory (``get_cpu_copy``), its pages
    freed; later new pages, the KV loaded back (``load_cpu_copy``). Returns (what the new pages hold, the host copy)."""
    a.set_plan([("r", "t1", 0, 8)])
    slots = a.alloc(8)
    a.clear_plan()
    for b in kv.buffers():
        b[slots] = torch.arange(8, dtype=torch.float32)[:, None, None] + 1.5
    expected = kv.read(slots).clone()
    host = a.get_cpu_copy(slots)
    with a.releasing("t1", "r"):
        a.free(slots)
    a.end_step()
    a.set_plan([("r", "t1", 0, 8)])
    again = a.alloc(8)
    a.clear_plan()
    a.load_cpu_copy(host, again)
    return kv.read(again), expected, host


def _host_bytes(host):
    return [t for layer in host for chunk in layer for t in chunk]


def test_retraction_cpu_copy_round_trips_and_leaves_no_bytes_in_host_memory(flavor):
    kv = MHAPool(32, 4)
    seen, expected, host = _retract_and_resume(paged_alloc(32, 4, kv=kv), kv)
    assert torch.equal(seen, expected), "the reloaded KV differs from what was offloaded"
    assert all(torch.count_nonzero(t).item() == 0 for t in _host_bytes(host)), "the host copy kept KV bytes"


def test_twin_keeping_the_host_copy_leaves_kv_bytes_in_host_memory(flavor, monkeypatch):
    from kvshield_sglang import allocator

    monkeypatch.setattr(allocator, "_zero_host_copy", lambda obj: None)
    kv = MHAPool(32, 4)
    _, _, host = _retract_and_resume(paged_alloc(32, 4, kv=kv), kv)
    assert any(torch.count_nonzero(t).item() for t in _host_bytes(host)), "the oracle above cannot fail"


def test_resize_rebuilds_an_empty_pool_and_refuses_one_holding_pages(flavor):
    import types

    from kvshield_sglang.errors import KvShieldError

    a = paged_alloc(32, 4)
    x = a.alloc(4)
    with pytest.raises(KvShieldError, match="while 1 page\\(s\\) are owned"):
        a.resize(types.SimpleNamespace(max_total_num_tokens=16))
    assert a.available_size() == 28 and a.size == 32
    a.free(x)
    a.end_step()
    a.resize(types.SimpleNamespace(max_total_num_tokens=16))
    assert a.size == 16 and a.num_pages == 4 and a.available_size() == 16
    assert a.alloc(16).tolist() == list(range(4, 20)) and a.alloc(4) is None


def test_oversized_alloc_is_none_and_unaligned_segment_frees_its_page(flavor):
    a = paged_alloc(16, 4)
    assert a.alloc(64) is None and a.available_size() == 16
    x = a.alloc(8)
    a.free_segment(x[2:5], start_pos=2)  # positions 2..4: the pages of both, as SGLang's free_segment frees them
    assert a.rejected_frees() == 0
    a.end_step()
    assert a.available_size() == 16


def test_free_pages_are_page_id_tensors_with_released_pages_where_sglang_lists_them(flavor):
    paged, token = paged_alloc(16, 4), token_alloc(8)
    x = paged.alloc(8)
    paged.free(x[:4])
    assert paged.free_pages.tolist() == [1, 3, 4] and paged.release_pages.numel() == 0  # freed first
    y = token.alloc(3)
    token.free(y[:1])
    assert token.free_pages.tolist() == [4, 5, 6, 7, 8, 1]  # SGLang's token allocator appends freed slots
