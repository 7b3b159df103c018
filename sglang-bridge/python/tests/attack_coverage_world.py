"""Attack scenarios against the coverage promise (every KV-holding tensor of a real SGLang pool is
protected or refused, naming it), run in a subprocess on the real upstream SGLang by
``test_attack_coverage.py`` (``real_sglang.py``); each reports pass / fail / error."""

import types

import torch

import coverage_world as cw
import scenarios
from kvshield_sglang.errors import UnsupportedFeatureError
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
        try:
            alloc = cw.build_allocator(pool, 16, 4, sa)
        except UnsupportedFeatureError as e:
            assert "dq_k_buffer" in str(e) and "dq_v_buffer" in str(e), f"refusal does not name the workspace: {e}"
            return
        try:
            alloc.begin_step()
            alloc.set_plan([("req-B", "tenant-b", 0, 4)])
            slots_b = alloc.alloc(4)
            alloc.set_plan([("req-A", "tenant-a", 0, 4)])
            slots_a = alloc.alloc(4)
            alloc.clear_plan()
            assert int(slots_a[0]) // 4 != 1, f"premise: A's page is not page 1 (A {slots_a.tolist()}, B {slots_b.tolist()})"
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
                    left.append(f"{name} rows {rows} (pages {sorted({r // 4 for r in rows})}; A held {slots_a.tolist()},"
                                f" B holds {slots_b.tolist()})")
            assert not left, "A's KV survives its release in " + "; ".join(left)
        finally:
            alloc.close()


# scenario -> (world, its arguments); a twin plants the defect back (here: the operator accepts the gap)
WORLDS = {
    "fp4_dequant_workspace": ("fp4_dequant_workspace_keeps_released_kv", {}),
    "twin/fp4_dequant_workspace_accepted": ("fp4_dequant_workspace_keeps_released_kv",
                                            dict(accept="fp4-dequant-workspace")),
}


def main():
    cw.install()
    scenarios.report({name: (globals()[fn], kw) for name, (fn, kw) in WORLDS.items()})
