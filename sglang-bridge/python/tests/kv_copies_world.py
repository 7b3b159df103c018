"""Scenarios of KV copied beside the pool's slots against the coverage promise (every KV-holding tensor of a real SGLang pool is
protected or refused, naming it), run in a subprocess on the real upstream SGLang by
``test_kv_copies_beside_the_pool.py`` (``real_sglang.py``); each reports pass / fail / error."""

import types

import torch

import coverage_world as cw
import scenarios
from sglang.srt.layers.quantization import fp4_kv_cache_quant_method as fp4q


def _layer():
    return types.SimpleNamespace(layer_id=0, tp_k_head_num=2, tp_v_head_num=2, head_dim=32)


def fp4_dequant_workspace_keeps_released_kv(accept=""):
    """NVFP4 KV (``MHATokenToKVPool`` with ``NVFP4KVCacheMethod``): FlashInfer's extend
    (``get_flashinfer_dequant_workspace_kv_buffer``, prepare_workspace, not ragged) copies each request's KV
    into the shared dequant workspace packed from row ``page_size`` on, not at the request's slots. Tenant B
    holds page 1; tenant A prefills 4 tokens on another page, then releases. At ZERO every byte of A's KV must
    be gone after its release; the workspace was registered as if slot-indexed, so rows of B's page keep
    A's keys and values. Promised: refused at start naming the workspace, or no byte of A's KV left."""
    with cw.settings("ZERO", accept=accept) as sa:
        pool = cw.mha_quant(fp4q.NVFP4KVCacheMethod)()
        alloc = cw.built_or_refused(lambda: cw.build_allocator(pool, 16, 4, sa), "dq_k_buffer", "dq_v_buffer")
        if alloc is None:
            return
        try:
            alloc.begin_step()
            alloc.set_plan([("req-B", "tenant-b", 0, 4)])
            slots_b = alloc.alloc(4)
            alloc.set_plan([("req-A", "tenant-a", 0, 4)])
            slots_a = alloc.alloc(4)
            alloc.clear_plan()
            assert int(slots_a[0]) // 4 != 1, \
                f"premise: A's page is not page 1 (A {slots_a.tolist()}, B {slots_b.tolist()})"
            req_to_token = torch.zeros(2, 16, dtype=torch.int64)
            req_to_token[1, :4] = slots_a
            k = torch.full((4, 2, 32), 3.0, dtype=torch.bfloat16)
            pool.get_flashinfer_dequant_workspace_kv_buffer(
                _layer(), req_to_token, [1], [0], [4], 4, prepare_workspace=True, use_ragged=False, k_cur=k, v_cur=k)
            for t in [*pool.k_buffer, *pool.v_buffer, *pool.k_scale_buffer, *pool.v_scale_buffer]:
                t[slots_a] = 0x5A  # A's own pages hold its KV too
            held = [name for name, t in (("dq_k_buffer", pool.dq_k_buffer), ("dq_v_buffer", pool.dq_v_buffer))
                    if torch.count_nonzero(t.view(t.shape[0], -1).view(torch.uint8))]
            assert held, "premise: the extend put A's KV in the dequant workspace"
            with alloc.releasing("tenant-a", "req-A"):
                alloc.free(slots_a)
            alloc.begin_step()
            left = []
            for name, t in (("dq_k_buffer", pool.dq_k_buffer), ("dq_v_buffer", pool.dq_v_buffer)):
                rows = torch.nonzero(t.reshape(t.shape[0], -1).view(torch.uint8).any(dim=1)).flatten().tolist()
                if rows:
                    left.append(f"{name} rows {rows} (pages {sorted({r // 4 for r in rows})};"
                                f" A held {slots_a.tolist()}, B holds {slots_b.tolist()})")
            assert not left, "A's KV survives its release in " + "; ".join(left)
        finally:
            alloc.close()


def refused_swa_draft_leaves_no_sub_allocator_changed(plant=False):
    """SWA accepted (both sub-pools under kvshield sub-allocators): a draft worker's SWA pool whose SWA sub-pool
    holds a tensor kvshield does not know is refused naming it. "Fail closed ... leaves the pool as it was": the
    full sub-allocator must not keep the draft's full sub-pool registered when its sibling refused. ``plant``
    passes each pool's first check (the hook's check of every sub-pool before registering any), so each
    sub-allocator checks only as it registers: the defect as it was."""
    from kvshield_sglang import allocator as kv_allocator

    cls = kv_allocator.PagedTokenToKVPoolAllocator
    saved, checked = cls.kvshield_check_kvcache, set()

    def registering_checks_only(self, kvcache):
        if id(kvcache) not in checked:
            checked.add(id(kvcache))
            return None
        return saved(self, kvcache)

    if plant:
        cls.kvshield_check_kvcache = registering_checks_only
    try:
        with cw.settings("ZERO", accept="swa") as sa:
            t = cw.configurator(sa, 4, swa=True)._init_pools(sizes=cw.sizes(16, swa_total=8), req_to_token_pool=None,
                                                             token_to_kv_pool_allocator=None)
            a = t.token_to_kv_pool_allocator
            draft = cw.configurator(sa, 4, swa=True, draft=True, head_dim=16)
            build = draft._build_token_to_kv_pool

            def with_rope_cache(**kw):
                pool = build(**kw)
                pool.swa_kv_pool.rope_cache = torch.zeros(12, 2, 16)  # slot-indexed, unknown to kvshield
                return pool

            draft._build_token_to_kv_pool = with_rope_cache
            try:
                cw.refused(lambda: draft._init_pools(sizes=cw.sizes(16, swa_total=8),
                                                     req_to_token_pool=t.req_to_token_pool,
                                                     token_to_kv_pool_allocator=a), "rope_cache")
                changed = [f"{name} now protects {len(sub.kvshield_kvcaches())} pools"
                           for name, sub in (("full_attn_allocator", a.full_attn_allocator),
                                             ("swa_attn_allocator", a.swa_attn_allocator))
                           if len(sub.kvshield_kvcaches()) != 1]
                assert not changed, "the refused draft pool was half registered: " + "; ".join(changed)
            finally:
                a.full_attn_allocator.close()
                a.swa_attn_allocator.close()
    finally:
        cls.kvshield_check_kvcache = saved


def kv_canary_keeps_released_token_ids(accept=""):
    """``--kv-canary log`` (SGLang's KV canary, "production-safe"): after the pools are built, ``install_canary``
    attaches per-slot canary buffers to the KV pool (``attach_canary_buffers``) and each forward writes, per
    token slot, the token id and position there (SGLang's reference writer here). They hold a request's tokens
    at its slots, yet are neither registered nor refused: after tenant A's release at ZERO its token ids stay.
    Promised: refused at start naming --kv-canary, or no byte of A's canary rows left after release."""
    from sglang.kernels.ops.kv_canary import consts
    from sglang.kernels.ops.kv_canary.verify import CanaryLaunchTag, VerifyOrWriteContext
    from sglang.kernels.ops.kv_canary.write import WritePlan
    from sglang.kernels.ops.kv_canary.write_ref import launch_canary_write_kernel_torch_reference
    from sglang.srt.kv_canary.config import CanaryConfig
    from sglang.srt.kv_canary.pool_patcher.api import attach_canary_buffers

    with cw.settings("ZERO", accept=accept, kv_canary="log") as sa:
        pool = cw.mha()()
        alloc = cw.built_or_refused(lambda: cw.build_allocator(pool, 16, 4, sa), "--kv-canary")
        if alloc is None:
            return
        try:
            config = CanaryConfig.from_env(sa)
            group, = attach_canary_buffers(pool=pool, config=config, device=torch.device("cpu"),
                                           kv_token_id_vs_position_offset=0)
            alloc.begin_step()
            alloc.set_plan([("req-A", "tenant-a", 0, 4)])
            slots = alloc.alloc(4)
            alloc.clear_plan()
            tokens = torch.tensor([1501, 1502, 1503, 1504])
            bufs = {"k_head": group.k_head, "v_head": group.v_head}
            for (name, buf), tag in zip(bufs.items(), (CanaryLaunchTag.HEAD_K_FULL, CanaryLaunchTag.HEAD_V_FULL)):
                launch_canary_write_kernel_torch_reference(
                    context=VerifyOrWriteContext(
                        canary_buf=buf, kernel_kind=tag,
                        violation_ring=torch.zeros(16, consts.VIOLATION_FIELDS, dtype=torch.int64),
                        violation_write_index=torch.zeros(1, dtype=torch.int32),
                        slot_run_counter=torch.zeros(1, dtype=torch.int64),
                        kernel_run_counter=torch.zeros(1, dtype=torch.int64), real_kv_sources=(),
                        real_kv_hash_mode=config.real_kv_hash_mode,
                        enable_chain_position_assert=torch.zeros(1, dtype=torch.int32)),
                    plan=WritePlan(write_offsets=torch.tensor([0, 4]), write_seed_slot_indices=torch.tensor([-1]),
                                   write_num_valid_reqs=torch.tensor([1], dtype=torch.int32)),
                    input_ids=tokens, positions=torch.arange(4), out_cache_loc=slots, enable_write_input_assert=False,
                    expected_input_tokens=None, expected_input_positions=None)
            token_field = consts.CANARY_FIELD_TOKEN
            assert group.k_head.view(torch.int64)[slots, token_field].tolist() == tokens.tolist(), \
                "premise: the canary holds A's token ids at A's slots"
            with alloc.releasing("tenant-a", "req-A"):
                alloc.free(slots)
            alloc.begin_step()
            left = {name: buf.view(torch.int64)[slots, token_field].tolist() for name, buf in bufs.items()
                    if torch.count_nonzero(buf[slots])}
            assert not left, \
                f"A's token ids survive its release in the canary buffers at slots {slots.tolist()}: {left}"
        finally:
            alloc.close()


def pd_staging_buffer_keeps_released_kv(accept=""):
    """A prefill server with ``SGLANG_DISAGG_STAGING_BUFFER=1`` (heterogeneous-TP PD transfers): each request's
    KV is gathered head slice by head slice into a GPU staging buffer (``gather_kv_head_slices``, as
    ``gather_all_layers_to_staging`` does per layer) and sent from there; the buffer is neither registered nor
    refused, so after the request's release at ZERO its K stays there. (The staging buffer itself is CUDA only:
    a CPU tensor of its bytes stands in for it.) Promised: refused at start naming SGLANG_DISAGG_STAGING_BUFFER,
    or no byte of the KV left after release."""
    import os

    from sglang.srt.disaggregation.common.staging_buffer import gather_kv_head_slices

    os.environ["SGLANG_DISAGG_STAGING_BUFFER"] = "1"
    try:
        with cw.settings("ZERO", accept=accept, disaggregation_mode="prefill") as sa:
            pool = cw.mha()()
            alloc = cw.built_or_refused(lambda: cw.build_allocator(pool, 16, 4, sa), "SGLANG_DISAGG_STAGING_BUFFER")
            if alloc is None:
                return
            try:
                alloc.begin_step()
                alloc.set_plan([("req-A", "tenant-a", 0, 4)])
                slots = alloc.alloc(4)
                alloc.clear_plan()
                for t in [*pool.k_buffer, *pool.v_buffer]:
                    t[slots] = 3.0
                k = pool.k_buffer[0]
                staging = torch.zeros(4 * k.shape[1] * k.shape[2] * k.element_size(), dtype=torch.uint8)
                gather_idx = slots.view(-1, 1, 1).expand(4, k.shape[1], k.shape[2])
                gather_kv_head_slices(k, gather_idx, 0, k.shape[1], staging.view(k.dtype).reshape(4, *k.shape[1:]))
                assert torch.count_nonzero(staging), "premise: A's K is in the staging buffer"
                with alloc.releasing("tenant-a", "req-A"):
                    alloc.free(slots)
                alloc.begin_step()
                assert not torch.count_nonzero(pool.k_buffer[0][slots]), "premise: A's pages were scrubbed"
                left = torch.count_nonzero(staging).item()
                assert not left, \
                    f"A's KV survives its release in the PD staging buffer: {left} of {staging.numel()} bytes"
            finally:
                alloc.close()
    finally:
        del os.environ["SGLANG_DISAGG_STAGING_BUFFER"]


# scenario -> (world, its arguments); a twin plants the defect back (here: the operator accepts the gap)
WORLDS = {
    "fp4_dequant_workspace": ("fp4_dequant_workspace_keeps_released_kv", {}),
    "twin/fp4_dequant_workspace_accepted": ("fp4_dequant_workspace_keeps_released_kv",
                                            dict(accept="fp4-dequant-workspace")),
    "kv_canary": ("kv_canary_keeps_released_token_ids", {}),
    "twin/kv_canary_accepted": ("kv_canary_keeps_released_token_ids", dict(accept="kv-canary")),
    "pd_staging_buffer": ("pd_staging_buffer_keeps_released_kv", {}),
    "twin/pd_staging_buffer_accepted": ("pd_staging_buffer_keeps_released_kv", dict(accept="disagg-staging-buffer")),
    "swa_draft_refusal": ("refused_swa_draft_leaves_no_sub_allocator_changed", {}),
    "twin/swa_draft_refusal_registers_first": ("refused_swa_draft_leaves_no_sub_allocator_changed", dict(plant=True)),
}


def main():
    cw.install()
    scenarios.report({name: (globals()[fn], kw) for name, (fn, kw) in WORLDS.items()})
