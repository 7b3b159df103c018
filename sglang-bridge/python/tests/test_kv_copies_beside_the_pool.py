"""KV copied beside the pool's slots (workspaces, canaries, staging buffers) against the coverage promise
("every KV-holding tensor is covered or refused", README "Coverage"): scenarios in ``kv_copies_world.py``, run
in a subprocess on the real upstream SGLang (``real_sglang.py``). Each asserts on bytes; each twin plants the
defect back and must fail."""

import pytest

import real_sglang
from conftest import TEST_CLASSES, require_module, require_software
from scenarios import fails, passes

require_module("torch")


@pytest.fixture(scope="module")
def world(jvm, tmp_path_factory):
    require_software(real_sglang.available(), f"the upstream SGLang snapshot at {real_sglang.UPSTREAM}")
    return real_sglang.run_world("kv_copies_world", tmp_path_factory.mktemp("ranks"), TEST_CLASSES)


def test_fp4_dequant_workspace_is_refused_or_holds_no_released_kv(world):
    """NVFP4 KV: FlashInfer's extend copies a request's KV into the shared dequant workspace packed from row
    page_size on (another tenant's page here), not at its slots; scrubbing the released pages' rows leaves the
    copies. Promised: refused at start naming dq_k_buffer/dq_v_buffer, or no byte of the KV after release."""
    passes(world, "fp4_dequant_workspace")


def test_twin_fp4_dequant_workspace_accepted_keeps_the_released_kv(world):
    """The gap accepted (the defect as it was: the allocator opens over the workspace): the byte oracle must
    find the released request's KV in the workspace rows of another tenant's page."""
    fails(world, "twin/fp4_dequant_workspace_accepted", "A's KV survives its release in dq_k_buffer rows [4, 5, 6, 7]")


def test_a_refused_swa_draft_pool_leaves_both_sub_allocators_as_they_were(world):
    """SWA accepted: a draft SWA pool refused for its SWA sub-pool (a tensor kvshield does not know) must leave
    the full sub-allocator as it was, not protecting the draft's full sub-pool registered just before."""
    passes(world, "swa_draft_refusal")


def test_twin_registering_before_checking_every_sub_pool_half_registers(world):
    fails(world, "twin/swa_draft_refusal_registers_first", "full_attn_allocator now protects 2 pools")


def test_kv_canary_is_refused_or_keeps_no_released_token_ids(world):
    """--kv-canary: SGLang's canary buffers beside the KV pool hold, per token slot, the token id and position of
    the KV there (written by SGLang's reference canary writer). Promised: refused at start naming --kv-canary,
    or A's token ids gone from them after A's release."""
    passes(world, "kv_canary")


def test_twin_kv_canary_accepted_keeps_the_released_token_ids(world):
    fails(world, "twin/kv_canary_accepted", "A's token ids survive its release in the canary buffers")


def test_pd_staging_buffer_is_refused_or_keeps_no_released_kv(world):
    """SGLANG_DISAGG_STAGING_BUFFER=1 on a PD server: every transferred request's KV is copied through a GPU
    staging buffer kvshield does not register. Promised: refused at start naming it, or no KV left there."""
    passes(world, "pd_staging_buffer")


def test_twin_pd_staging_buffer_accepted_keeps_the_released_kv(world):
    fails(world, "twin/pd_staging_buffer_accepted", "A's KV survives its release in the PD staging buffer")
