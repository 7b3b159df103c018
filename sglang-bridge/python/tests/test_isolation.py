"""Leaks through reused pages, with real tensors: what request B of tenant 2 reads from the raw KV
memory of pages request A of tenant 1 wrote and freed. The NONE twin proves the test can fail."""

import pytest

from conftest import TEST_SEALER, require_module
from fakes import MHAPool

torch = require_module("torch")
PATTERN = 7.25


def _paged(level, kv, strict=False, keys=None):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", kv, False, kvshield_settings={
        "level": level, "strict": strict, "advertisedContextTokens": 32, **(keys or {"sealerFactory": TEST_SEALER})})


def _write_then_reuse(level, keys=None):
    kv = MHAPool(32, 4, layers=2)
    a = _paged(level, kv, keys=keys)
    a.begin_step()
    a.set_plan([("req-A", "tenant-1", 0, 8)])
    slots_a = a.alloc(8)
    a.clear_plan()
    for buf in kv.buffers():  # request A's forward writes its KV
        buf[slots_a] = PATTERN
    # NOTE: sealed (ENCRYPT) pages go to another tenant only once clean ones run out: hold the rest.
    a.set_plan([("req-filler", "tenant-1", 0, 24)])
    assert a.alloc(24) is not None
    with a.releasing("tenant-1", "req-A"):
        a.free(slots_a)
    a.begin_step()
    a.set_plan([("req-B", "tenant-2", 0, 8)])
    slots_b = a.alloc(8)
    a.clear_plan()
    assert sorted(slots_b.tolist()) == sorted(slots_a.tolist()), "B must get A's pages for the test to mean anything"
    assert a.page_owner(int(slots_b[0]) // 4) == ("tenant-2", a.request_id("req-B"))
    return kv.read(slots_b)


@pytest.mark.parametrize("level", ["ZERO", "COMPLIANCE", "ENCRYPT"])
def test_next_tenant_reads_zeros(jvm, level, tmp_path):
    keys = None
    if level == "COMPLIANCE":  # its signed audit trail is required
        from trail_tools import signing_keys

        key, _ = signing_keys(tmp_path)
        keys = {"sealerFactory": TEST_SEALER, "auditSigningKey": str(key), "auditDir": str(tmp_path / "trail")}
    seen = _write_then_reuse(level, keys=keys)
    assert torch.count_nonzero(seen).item() == 0


def test_encrypt_with_a_root_key_seals_with_tenant_keys(jvm):
    # rootKey: the backend's own sealer (tenant-keys' ChaCha20 on host memory; cuda-scrub's on CUDA).
    seen = _write_then_reuse("ENCRYPT", keys={"rootKey": "ephemeral"})
    assert torch.count_nonzero(seen).item() == 0


def test_twin_without_protection_sees_the_pattern(jvm):
    seen = _write_then_reuse("NONE")
    assert torch.all(seen == PATTERN).item()
