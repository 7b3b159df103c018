"""Every KV-holding tensor of real SGLang pools is protected, or the allocator refuses to start
naming it. Run in a subprocess on the real upstream SGLang (``real_sglang.py``) by
``test_coverage.py``; each scenario reports pass / fail / error (``scenarios.report``).

The isolation oracle enumerates the tensors itself, independently of ``buffers.py``: every tensor
reachable from the pool (attributes, lists, tuples, dicts, SGLang objects) whose leading dimension
is the allocator's token rows or pages. Tenant A writes distinctive bytes into every one of them
at its slots, frees; tenant B gets the same pages; every byte of every tensor there must be zero
(ZERO, COMPLIANCE), and under ENCRYPT the bytes A left must be sealed (not A's plaintext) before
B gets them zeroed. Pools are built through SGLang's own ``KVCacheConfigurator`` code (hooked by
``kvshield_sglang.coverage``). Planted-bug twins register all but one tensor: the oracle must fail
naming it.
"""

import contextlib
import functools
import json
import os
import tempfile
import types

import torch

import coverage_cases
import scenarios
from kvshield_sglang import allocator as kv_allocator
from kvshield_sglang import buffers, coverage, plugin
from kvshield_sglang.errors import UnsupportedFeatureError
from sglang.srt import runtime_context as rc
from sglang.srt.layers.quantization import fp4_kv_cache_quant_method as fp4q
from sglang.srt.mem_cache import kv_cache_builder
from sglang.srt.mem_cache import memory_pool as mp
from sglang.srt.mem_cache import swa_memory_pool
from sglang.srt.mem_cache.allocator import paged as up_paged
from sglang.srt.mem_cache.allocator import swa as up_swa
from sglang.srt.mem_cache.allocator import token as up_token
from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator

BF16 = torch.bfloat16
CPU = dict(device="cpu", enable_memory_saver=False)


def install():
    """What the plug-in's ``load()`` does first: kvshield's allocators in SGLang's modules, then the coverage hook."""
    plugin.replace_everywhere({up_token.TokenToKVPoolAllocator: kv_allocator.TokenToKVPoolAllocator,
                               up_paged.PagedTokenToKVPoolAllocator: kv_allocator.PagedTokenToKVPoolAllocator})
    coverage.install()


def audit_keys():
    """A fresh Ed25519 audit key pair and an empty trail directory (COMPLIANCE writes a signed trail and
    refuses to start without one): (signing key, public key, trail directory)."""
    import jpype

    from kvshield_sglang import runtime

    runtime.ensure_jvm()
    root = tempfile.mkdtemp(prefix="kvshield-audit-")
    keys = os.path.join(root, "keys")
    os.mkdir(keys)
    jpype.JClass("dev.kvshield.audit.AuditKeys").generate(jpype.JClass("java.nio.file.Path").of(keys))
    return os.path.join(keys, "audit-signing.key"), os.path.join(keys, "audit-signing.pub"), os.path.join(root, "trail")


def verify_trail(trail, pub):
    """The COMPLIANCE oracle's second half: the signed trail the allocator wrote verifies (chain and
    signatures) and records pages being released; returns the problems (empty: verified)."""
    import jpype

    Path = jpype.JClass("java.nio.file.Path")
    files = sorted(f for f in os.listdir(trail) if f.endswith(".jsonl")) if os.path.isdir(trail) else []
    # NOTE: one trail per pool the allocator opened (a draft pool's registration reopens it): each verified on its own
    trails = {}
    for f in files:
        trails.setdefault(f.rsplit("-", 1)[0], []).append(Path.of(os.path.join(trail, f)))
    problems = [] if trails else ["no audit trail was written"]
    for name, paths in sorted(trails.items()):
        report = jpype.JClass("dev.kvshield.audit.AuditVerifier").verify(
            jpype.JClass("java.util.List").of(*paths),
            jpype.JClass("dev.kvshield.audit.AuditKeys").loadPublicKey(Path.of(pub)))
        problems += [f"{name}: {p}" for p in report.problems()]
        if not report.ok() and not report.problems():
            problems.append(f"{name}: the audit trail does not verify")
    types_seen = {json.loads(line).get("type") for f in files
                  for line in open(os.path.join(trail, f)).read().splitlines() if line}
    if "release" not in types_seen:
        problems.append(f"the audit trail records no page release (record types {sorted(t for t in types_seen if t)})")
    return problems


@contextlib.contextmanager
def settings(level="ZERO", accept="", advertised=16, page_size=4, disaggregation_mode="null", **server_args):
    """Environment settings (SGLang builds the allocator without kvshield's keyword arguments) and a
    published SGLang config (what the configurator's code reads). COMPLIANCE gets a fresh audit key
    and trail directory (``settings.audit``: signing key, public key, trail), as a deployment must."""
    env = {"KVSHIELD_LEVEL": level, "KVSHIELD_ADVERTISED_CONTEXT_TOKENS": str(advertised), "KVSHIELD_ACCEPT_GAPS": accept,
           "KVSHIELD_ROOT_KEY": "ephemeral" if level == "ENCRYPT" else "",
           "KVSHIELD_AUDIT_SIGNING_KEY": "", "KVSHIELD_AUDIT_DIR": ""}
    settings.audit = None
    if level == "COMPLIANCE":
        settings.audit = audit_keys()
        env["KVSHIELD_AUDIT_SIGNING_KEY"], _, env["KVSHIELD_AUDIT_DIR"] = settings.audit
    saved = {k: os.environ.get(k) for k in env}
    for k, v in env.items():  # NOTE: "" is unset (kvshield refuses a setting given empty)
        if v:
            os.environ[k] = v
        else:
            os.environ.pop(k, None)
    ov = rc.get_context().override_server_args(page_size=page_size, disaggregation_mode=disaggregation_mode, **server_args)
    ov.install()
    try:
        with rc.get_parallel().override(attn_tp_size=1, attn_dcp_size=1, dcp_enabled=False):
            yield rc.get_context().server_args
    finally:
        ov.restore()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def configurator(server_args, page_size, *, draft=False, swa=False, mla=False, kv_cache_dtype_str="auto", layers=2,
                 head_dim=8):
    """A ``KVCacheConfigurator`` stand-in carrying the fields SGLang's pool-building methods read;
    the methods themselves are SGLang's (hooked ones included)."""
    mc = types.SimpleNamespace(
        hf_config=types.SimpleNamespace(architectures=["LlamaForCausalLM"]), hf_text_config=types.SimpleNamespace(),
        context_len=64, head_dim=head_dim, v_head_dim=head_dim, get_num_kv_heads=lambda *a: 2,
        kv_lora_rank=16, qk_rope_head_dim=8, swa_attention_layer_ids=[0], full_attention_layer_ids=[1])
    c = types.SimpleNamespace(
        is_hybrid_swa=swa, hybrid_gdn_config=None, mambaish_config=None, kv_cache_dtype=BF16,
        kv_cache_dtype_str=kv_cache_dtype_str, device="cpu", server_args=server_args, is_draft_worker=draft,
        draft_swa_full_capacity=False, page_size=page_size, use_mla_backend=mla, is_hybrid_swa_compress=False,
        is_inkling_mtp_draft=False, post_capture_kv_active=False, model_dtype=BF16, model_config=mc,
        layer_info=types.SimpleNamespace(num_effective_layers=layers, start_layer=0, end_layer=layers),
        draft_model_idx=None, pool_page_size=page_size, loc_space_scale=1)
    for name in dir(KVCacheConfigurator):
        if name.startswith(("_build", "_validate", "_init_pools")):
            setattr(c, name, functools.partial(getattr(KVCacheConfigurator, name), c))
    return c


def sizes(total, swa_total=None):
    return types.SimpleNamespace(max_total_num_tokens=total, max_running_requests=4,
                                 full_max_total_num_tokens=total if swa_total else None,
                                 swa_max_total_num_tokens=swa_total, c4_max_total_num_tokens=0,
                                 c128_max_total_num_tokens=0, c4_state_pool_size=0, c128_state_pool_size=0,
                                 c4_state_dtype=None, c128_state_dtype=None)


def build_allocator(pool, size, page_size, server_args, shared=None, swa_size=None):
    """SGLang's ``_build_token_to_kv_pool_allocator`` (hooked) over a pool built here."""
    c = configurator(server_args, page_size, draft=shared is not None, swa=swa_size is not None)
    return c._build_token_to_kv_pool_allocator(sizes=sizes(size, swa_size), token_to_kv_pool=pool, is_dsv4_model=False,
                                               req_to_token_pool=None, token_to_kv_pool_allocator=shared)


# ---------------------------------------------------------------- the oracle's own enumeration


def slot_tensors(pool, rows, page_size, label):
    """(path, tensor, indexed-by) of every tensor reachable from ``pool`` whose leading dimension is
    the token rows ("slot") or the pages ("page")."""
    out, seen = [], set()

    def walk(v, path):
        if torch.is_tensor(v):
            if v.dim() and v.numel() and v.shape[0] in (rows, rows // page_size):
                out.append((path, v, "slot" if v.shape[0] == rows else "page"))
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                walk(x, f"{path}[{i}]")
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(x, f"{path}[{k!r}]")
        elif type(v).__module__.startswith("sglang.") and not isinstance(v, type) and id(v) not in seen:
            seen.add(id(v))
            for k, x in list(vars(v).items()) if hasattr(v, "__dict__") else []:
                walk(x, f"{path}.{k}")

    walk(pool, label)
    return out


def _index(slots, kind, page_size):
    return slots if kind == "slot" else torch.unique(slots // page_size)


def _fill(t):
    return 3.0 if t.is_floating_point() else 0x5A


def _bytes(t, idx):
    return t[idx].contiguous().view(torch.uint8).reshape(-1)


def write_free_reuse(alloc, pools, level, size, page_size, n):
    """A writes every slot tensor of ``pools`` at its ``n`` slots, frees; B gets the same pages.
    Returns the failures (tensor paths and what their bytes showed)."""
    rows = size + page_size
    tensors = [t for i, p in enumerate(pools) for t in slot_tensors(p, rows, page_size, f"pool{i}")]
    assert tensors, "no slot tensors found"
    alloc.begin_step()
    alloc.set_plan([("req-A", "tenant-a", 0, n)])
    slots_a = alloc.alloc(n)
    alloc.clear_plan()
    plain = {}
    for path, t, kind in tensors:  # A's forward writes every buffer at its slots
        idx = _index(slots_a, kind, page_size)
        t[idx] = _fill(t)
        plain[path] = _bytes(t, idx).clone()
    # Sealed (ENCRYPT) pages go to another tenant only once clean ones run out: hold the rest.
    alloc.set_plan([("req-filler", "tenant-a", 0, size - n)])
    assert alloc.alloc(size - n) is not None
    alloc.clear_plan()
    with alloc.releasing("tenant-a", "req-A"):
        alloc.free(slots_a)
    alloc.begin_step()
    failures = []
    if level == "ENCRYPT":
        for path, t, kind in tensors:
            now = _bytes(t, _index(slots_a, kind, page_size))
            if torch.count_nonzero(now == plain[path]).item() * 8 > now.numel():
                failures.append(f"{path} still holds A's plaintext after release (not sealed)")
    alloc.set_plan([("req-B", "tenant-b", 0, n)])
    slots_b = alloc.alloc(n)
    alloc.clear_plan()
    assert sorted(slots_b.tolist()) == sorted(slots_a.tolist()), "B must get A's pages for the oracle to mean anything"
    for path, t, kind in tensors:
        seen = _bytes(t, _index(slots_b, kind, page_size))
        if torch.count_nonzero(seen).item():
            same = torch.count_nonzero(seen == plain[path]).item()
            failures.append(f"{path}: {torch.count_nonzero(seen).item()} of {seen.numel()} bytes at B's slots not zero"
                            f" ({same} equal A's plaintext)")
    return failures


def isolated(make_pool, size=16, page_size=4, n=None, levels=("ZERO", "COMPLIANCE", "ENCRYPT"), drafts=(), accept=""):
    """The oracle over one pool class at every level; ``drafts`` build pools registered through
    SGLang's draft path (the allocator passed in); ``accept``: the gaps the pool needs accepted."""
    for level in levels:
        with settings(level, accept=accept, advertised=size, page_size=page_size) as sa:
            pool = make_pool()
            alloc = build_allocator(pool, size, page_size, sa)
            extra = []
            for make_draft in drafts:
                d = make_draft()
                assert build_allocator(d, size, page_size, sa, shared=alloc) is alloc
                extra.append(d)
            try:
                failures = write_free_reuse(alloc, [pool, *extra], level, size, page_size, n or page_size)
            finally:
                alloc.close()
            if level == "COMPLIANCE":  # its signed trail, written by the pool the oracle just ran on
                failures += verify_trail(settings.audit[2], settings.audit[1])
            assert not failures, f"{level}: " + "; ".join(failures)


@contextlib.contextmanager
def planted_skip(adapter_key, label_part, past_the_start_check=True):
    """Planted bug: the adapter registers every tensor but the one whose label contains
    ``label_part``. The start-up check (every tensor a pool holds is accounted for) refuses that;
    ``past_the_start_check`` plants a second bug that hides it there too, so the byte oracle must
    find the tensor's bytes."""
    orig, orig_unaccounted = buffers.POOL_CLASSES[adapter_key], buffers._unaccounted

    def adapter(pool, cov, label):
        orig(pool, cov, label)
        for victim in [b for b in cov.buffers if label_part in b.label]:
            cov.buffers.remove(victim)

    def unaccounted(pool, label, cov):
        return [r for r in orig_unaccounted(pool, label, cov) if label_part not in r.where]

    buffers.POOL_CLASSES[adapter_key] = adapter
    if past_the_start_check:
        buffers._unaccounted = unaccounted
    try:
        yield
    finally:
        buffers.POOL_CLASSES[adapter_key], buffers._unaccounted = orig, orig_unaccounted


def refused(fn, *parts):
    """``fn`` must raise UnsupportedFeatureError whose message names every part."""
    try:
        fn()
    except UnsupportedFeatureError as e:
        return _naming(e, parts)
    raise AssertionError(f"not refused (expected a refusal naming {parts})")


def built_or_refused(fn, *parts):
    """``fn()``, or None when it raised UnsupportedFeatureError naming every part: for memory that is either
    refused at start or must then be protected."""
    try:
        return fn()
    except UnsupportedFeatureError as e:
        _naming(e, parts)
        return None


def _naming(refusal, parts):
    missing = [p for p in parts if p not in str(refusal)]
    assert not missing, f"refusal does not name {missing}: {refusal}"
    return str(refusal)


# ---------------------------------------------------------------- pool constructors


def mha(size=16, page_size=4, head_dim=8, layers=2):
    return lambda: mp.MHATokenToKVPool(size, page_size, BF16, 2, head_dim, layers, **CPU)


def mha_quant(method):
    return lambda: mp.MHATokenToKVPool(16, 4, torch.float4_e2m1fn_x2, 2, 32, 2, **CPU, quant_method=method(2, "cpu"))


def mha_hnd():
    os.environ["SGLANG_USE_HND_KVCACHE"] = "1"
    try:
        return mp.MHATokenToKVPool(16, 4, BF16, 2, 8, 2, **CPU)
    finally:
        del os.environ["SGLANG_USE_HND_KVCACHE"]


def dsa():
    return mp.DSATokenToKVPool(128, 64, 16, BF16, 8, 2, "cpu", 128, False, 24, skip_topk_layers=[False, True])


def minimax():
    return mp.MiniMaxSparseKVPool(size=16, page_size=4, dtype=BF16, head_num=2, head_dim=8, idx_head_dim=16,
                                  dense_layer_ids=[0], sparse_layer_ids=[1, 2], disable_value_sparse_layer_ids=[2],
                                  device="cpu", start_layer=0, end_layer=3)


def mla(cls=mp.MLATokenToKVPool, rank=16):
    return lambda: cls(16, 4, BF16, rank, 8, 2, **CPU)


ISOLATION = {
    "mha": (mha(), {}),
    "mha_token_allocator": (mha(page_size=1), dict(page_size=1, n=4)),
    "mha_hnd": (mha_hnd, {}),
    # the dequant workspace is a gap (FlashInfer's extend writes it packed): accepted, its rows at the slots are scrubbed
    "mha_nvfp4_scales_and_workspace": (mha_quant(fp4q.NVFP4KVCacheMethod), dict(accept="fp4-dequant-workspace")),
    "mha_fp4_mx_block16_scales": (mha_quant(fp4q.FP4MXBlock16KVCacheMethod), {}),
    "mha_fp4": (lambda: mp.MHATokenToKVPoolFP4(16, 4, torch.uint8, 2, 32, 2, **CPU), {}),
    "mha_mxfp8": (lambda: mp.MHATokenToKVPoolMXFP8(16, 4, torch.float8_e4m3fn, 2, 32, 2, **CPU), {}),
    "mha_mxfp8_interleaved_scales": (lambda: mp.MHATokenToKVPoolMXFP8(256, 128, torch.float8_e4m3fn, 2, 32, 2, **CPU),
                                     dict(size=256, page_size=128)),
    "mha_page_major": (lambda: mp.PageMajorMHATokenToKVPool(16, 4, BF16, 2, 8, 2, **CPU), {}),
    "k_only": (lambda: mp.MHATokenToKOnlyPool(16, 4, BF16, 2, 8, 2, **CPU), {}),
    "mla": (mla(), {}),
    "mla_fp4_scales": (mla(mp.MLATokenToKVPoolFP4, 64), {}),
    "dsa_indexer": (dsa, dict(size=128, page_size=64)),
    "minimax_sparse_composite": (minimax, {}),
    "draft_of_another_shape": (mha(), dict(drafts=(mha(head_dim=16, layers=1),))),
}

def twin(scenario, adapter, label_part, named):
    """A planted twin of an isolation scenario (``coverage_cases.TWINS``): the oracle must fail naming ``named``."""
    make, kw = ISOLATION[scenario]
    with planted_skip(("sglang.srt.mem_cache.memory_pool", adapter), label_part):
        try:
            isolated(make, levels=("ZERO",), **kw)
        except AssertionError as e:
            assert named in str(e), f"the oracle failed but did not name {named}: {e}"
            raise


# ---------------------------------------------------------------- SGLang's own pool construction


def configured_target_and_draft():
    """SGLang's ``_init_pools`` (hooked) builds the target's pool and allocator, then the draft
    worker's pool over the same allocator: the draft's buffers are registered and protected."""
    with settings("ZERO") as sa:
        t = configurator(sa, 4)._init_pools(sizes=sizes(16), req_to_token_pool=None, token_to_kv_pool_allocator=None)
        d = configurator(sa, 4, draft=True, layers=1, head_dim=16)._init_pools(
            sizes=sizes(16), req_to_token_pool=t.req_to_token_pool,
            token_to_kv_pool_allocator=t.token_to_kv_pool_allocator)
        alloc = t.token_to_kv_pool_allocator
        assert d.token_to_kv_pool_allocator is alloc and isinstance(alloc, kv_allocator.PagedTokenToKVPoolAllocator)
        assert [type(k) for k in alloc.kvshield_kvcaches()] == [mp.MHATokenToKVPool, mp.MHATokenToKVPool]
        assert "pools=MHATokenToKVPool+MHATokenToKVPool buffers=6" in alloc.kvshield_rank_detail, alloc.kvshield_rank_detail
        try:
            failures = write_free_reuse(alloc, [t.token_to_kv_pool, d.token_to_kv_pool], "ZERO", 16, 4, 4)
        finally:
            alloc.close()
        assert not failures, "; ".join(failures)


def configured_mxfp8_and_mla():
    """The configurator's MXFP8 (--kv-cache-dtype mxfp8) and MLA branches, end to end."""
    for kw in (dict(kv_cache_dtype_str="mxfp8", head_dim=32), dict(mla=True)):
        with settings("COMPLIANCE") as sa:
            t = configurator(sa, 4, **kw)._init_pools(sizes=sizes(16), req_to_token_pool=None,
                                                      token_to_kv_pool_allocator=None)
            try:
                failures = write_free_reuse(t.token_to_kv_pool_allocator, [t.token_to_kv_pool], "COMPLIANCE", 16, 4, 4)
            finally:
                t.token_to_kv_pool_allocator.close()
            failures += verify_trail(settings.audit[2], settings.audit[1])
            assert not failures, f"{type(t.token_to_kv_pool).__name__}: " + "; ".join(failures)


def swa_refused_through_sglangs_swa_allocator():
    """A hybrid-SWA model: the configurator would build SGLang's SWA allocator, whose sub-allocators
    (kvshield's) each see one sub-pool; the hook refuses the SWA pool first, naming its tensors."""
    with settings("ZERO") as sa:
        c = configurator(sa, 4, swa=True)
        refused(lambda: c._init_pools(sizes=sizes(16, swa_total=8), req_to_token_pool=None,
                                      token_to_kv_pool_allocator=None),
                "SWAKVPool", "full_kv_pool.k_buffer[0]", "swa_kv_pool.v_buffer[0]", "KVSHIELD_ACCEPT_GAPS=swa")


def swa_accepted_covers_both_sub_pools():
    """With the swa gap accepted, both sub-pools sit under kvshield sub-allocators (checked after
    ``_init_pools``), a draft worker's SWA sub-pools are registered with the same sub-allocators,
    each scrubs every pool on its slots, and the rank's record names the gap."""
    with settings("ZERO", accept="swa") as sa:
        t = configurator(sa, 4, swa=True)._init_pools(sizes=sizes(16, swa_total=8), req_to_token_pool=None,
                                                      token_to_kv_pool_allocator=None)
        a, pool = t.token_to_kv_pool_allocator, t.token_to_kv_pool
        d = configurator(sa, 4, swa=True, draft=True, head_dim=16)._init_pools(
            sizes=sizes(16, swa_total=8), req_to_token_pool=t.req_to_token_pool, token_to_kv_pool_allocator=a)
        assert isinstance(a, up_swa.SWATokenToKVPoolAllocator) and isinstance(pool, swa_memory_pool.SWAKVPool)
        draft = d.token_to_kv_pool
        for sub, pools, n in ((a.full_attn_allocator, [pool.full_kv_pool, draft.full_kv_pool], 16),
                              (a.swa_attn_allocator, [pool.swa_kv_pool, draft.swa_kv_pool], 8)):
            assert isinstance(sub, kv_allocator.PagedTokenToKVPoolAllocator)
            assert sub.kvshield_kvcaches() == pools
            assert "accepted-gaps=swa" in sub.kvshield_rank_detail, sub.kvshield_rank_detail
            try:
                failures = write_free_reuse(sub, pools, "ZERO", n, 4, 4)
            finally:
                sub.close()
            assert not failures, "; ".join(failures)


def unknown_pool_class_refused():
    class VendorPool(mp.MHATokenToKVPool):
        pass

    with settings() as sa:
        refused(lambda: build_allocator(VendorPool(16, 4, BF16, 2, 8, 2, **CPU), 16, 4, sa),
                "VendorPool", "k_buffer[0]", "KVSHIELD_ACCEPT_GAPS=unknown-pool:VendorPool")


def adapter_missing_a_tensor_refused_at_start():
    """The planted twins' first bug alone (an adapter leaving one tensor out) stops the start,
    naming the tensor: every tensor a pool holds must be accounted for."""
    make, kw = ISOLATION["mha_nvfp4_scales_and_workspace"]
    with planted_skip(("sglang.srt.mem_cache.memory_pool", "MHATokenToKVPool"), "v_scale_buffer[1]",
                      past_the_start_check=False):
        with settings(accept=kw["accept"]) as sa:
            refused(lambda: build_allocator(make(), 16, 4, sa), "target:MHATokenToKVPool.v_scale_buffer[1]",
                    "unknown-tensor:MHATokenToKVPool.v_scale_buffer")


def unknown_tensor_refused():
    """A tensor the adapter does not know, on the pool or nested in an SGLang object it holds."""
    with settings() as sa:
        pool = mha()()
        pool.k_rotary_cache = torch.zeros(20, 2, 8)
        refused(lambda: build_allocator(pool, 16, 4, sa), "target:MHATokenToKVPool.k_rotary_cache ((20, 2, 8)",
                "unknown-tensor:MHATokenToKVPool.k_rotary_cache")
    with settings(page_size=64, advertised=128) as sa:
        pool = dsa()
        pool.index_key_cache.scale_cache = torch.zeros(3, 64)
        refused(lambda: build_allocator(pool, 128, 64, sa), "DSATokenToKVPool.index_key_cache.scale_cache")
    # SGLang's address/stride tables hold one integer per buffer: one whose length happens to equal the page
    # rows (12 tokens of page 4: 4 rows; 2 layers: 4 buffers) is a table, not KV; a tensor under a table's
    # name shaped like KV (slot rows, or more entries than the pool has buffers) is still refused.
    with settings(advertised=12) as sa:
        pool = mha(size=12)()
        assert pool.data_ptrs.shape == (4,) and pool.data_strides.shape == (4,), "the premise: tables of page-row length"
        build_allocator(pool, 12, 4, sa).close()
    with settings() as sa:
        pool = mha()()
        pool.data_ptrs = torch.zeros(20, 2, 8)
        refused(lambda: build_allocator(pool, 16, 4, sa), "target:MHATokenToKVPool.data_ptrs ((20, 2, 8)",
                "unknown-tensor:MHATokenToKVPool.data_ptrs")
        pool = mha()()
        pool.k_data_ptrs = torch.zeros(5, dtype=torch.int64)  # 5 page rows, 4 buffers: not one entry per buffer
        refused(lambda: build_allocator(pool, 16, 4, sa), "target:MHATokenToKVPool.k_data_ptrs ((5,)")


def hybrid_linear_refuses_mamba_state():
    """``HybridLinearKVPool``: its full-attention sub-pool is covered; the Mamba state pool is
    refused naming its tensors. (A real ``MambaPool`` needs a model's linear-state cache params
    and Mamba kernels; the pool is assembled from SGLang's own classes without running their
    constructors, holding a real MHA sub-pool.)"""
    pool = object.__new__(mp.HybridLinearKVPool)
    pool.full_kv_pool = mha()()
    mamba = object.__new__(mp.MambaPool)
    mamba.conv_state = torch.zeros(5, 2, 8)
    pool.mamba_pool = mamba
    with settings() as sa:
        refused(lambda: build_allocator(pool, 16, 4, sa), "mamba_pool", "conv_state", "KVSHIELD_ACCEPT_GAPS=mamba")
    with settings(accept="mamba") as sa:
        a = build_allocator(pool, 16, 4, sa)
        try:
            assert "buffers=4" in a.kvshield_rank_detail and "accepted-gaps=mamba" in a.kvshield_rank_detail, \
                a.kvshield_rank_detail
            failures = write_free_reuse(a, [pool.full_kv_pool], "ZERO", 16, 4, 4)
        finally:
            a.close()
        assert not failures, "; ".join(failures)


def unconstructible_classes_refused_by_class():
    """Pool classes that cannot be built here (CUDA/NPU-only, DeepSeek-V4's compressor state,
    HiSparse host tiers, unified VMM pools): the table refuses them by their real class, with
    their gap. Built with ``object.__new__`` (no constructor runs)."""
    import importlib

    cases = {("sglang.srt.mem_cache.deepseek_v4_memory_pool", "DeepSeekV4TokenToKVPool"): "dsv4",
             ("sglang.srt.mem_cache.hisparse_memory_pool", "HiSparseDSATokenToKVPool"): "hisparse",
             ("sglang.srt.mem_cache.dsa_cache_layer_split", "LayerSplitDSATokenToKVPool"): "dsa-layer-split",
             ("sglang.srt.mem_cache.unified_memory_pool", "UnifiedMHATokenToKVPool"): "unified-memory",
             ("sglang.srt.mem_cache.swa_memory_pool", "SWAKVPool"): "swa"}
    for (module, name), gap in cases.items():
        cls = getattr(importlib.import_module(module), name)
        got = buffers.class_refusals(object.__new__(cls))
        assert [r.gap for r in got] == [gap], f"{name}: {got}"
    noop = object.__new__(mp.NoOpMHATokenToKVPool)
    assert [r.gap for r in buffers.class_refusals(noop)] == [None]  # nothing to protect: never accepted


def post_capture_pool_refused():
    pool = mha()()
    pool.post_capture_active = True
    with settings(accept="all") as sa:
        refused(lambda: build_allocator(pool, 16, 4, sa), "backed after CUDA-graph capture",
                "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=0")


def server_features_refused_unless_accepted():
    with settings(enable_hierarchical_cache=True) as sa:
        refused(lambda: build_allocator(mha()(), 16, 4, sa), "--enable-hierarchical-cache", "KVSHIELD_ACCEPT_GAPS=hicache")
    _starts_naming_accepted("hicache", enable_hierarchical_cache=True)


def _starts_naming_accepted(gap, **server_args):
    """With ``gap`` accepted, the allocator starts under ``server_args`` and names the gap on the rank's record."""
    with settings(accept=gap, **server_args) as sa:
        a = build_allocator(mha()(), 16, 4, sa)
        try:
            assert f"accepted-gaps={gap}" in a.kvshield_rank_detail, a.kvshield_rank_detail
        finally:
            a.close()


def memory_saver_refused_unless_accepted():
    """``--enable-memory-saver`` puts the KV pool in a region SGLang's ``release_memory_occupation`` unmaps and
    ``resume_memory_occupation`` maps back (torch_memory_saver: not on these machines, so no bytes to read here):
    refused by SGLang's own ``_init_pools`` before any pool is built, naming the flag and the gap; accepted, the
    allocator starts and names it on the rank's record."""
    with settings(enable_memory_saver=True) as sa:
        refused(lambda: configurator(sa, 4)._init_pools(sizes=sizes(16), req_to_token_pool=None,
                                                        token_to_kv_pool_allocator=None),
                "--enable-memory-saver", "KVSHIELD_ACCEPT_GAPS=memory-saver")
        refused(lambda: build_allocator(mha()(), 16, 4, sa), "--enable-memory-saver", "KVSHIELD_ACCEPT_GAPS=memory-saver")
    _starts_naming_accepted("memory-saver", enable_memory_saver=True)


def decode_retraction_host_pool_refused():
    """A decode server's default retraction backend is a host pool: refused at start unless accepted
    (then named on the rank's record)."""
    for accept in ("", "retraction-host-pool"):
        with settings(accept=accept, disaggregation_mode="decode") as sa:
            a = build_allocator(mha()(), 16, 4, sa)
            worker = types.SimpleNamespace(get_memory_pool=lambda: (None, a), is_hybrid_swa=False)
            try:
                if not accept:
                    refused(lambda: kv_cache_builder.resolve_decode_retraction_backup(tp_worker=worker),
                            "host_pool", "KVSHIELD_ACCEPT_GAPS=retraction-host-pool")
                else:
                    assert kv_cache_builder.resolve_decode_retraction_backup(tp_worker=worker) == "host_pool"
                    assert "accepted-gaps=retraction-host-pool" in a.kvshield_rank_detail, a.kvshield_rank_detail
            finally:
                a.close()


def draft_after_first_use_refused():
    with settings() as sa:
        a = build_allocator(mha()(), 16, 4, sa)
        try:
            a.begin_step()
            a.alloc(4)
            refused(lambda: build_allocator(mha(head_dim=16, layers=1)(), 16, 4, sa, shared=a),
                    "after the allocator started serving")
            assert len(a.kvshield_kvcaches()) == 1
        finally:
            a.close()


def init_pools_refuses_an_allocator_kvshield_does_not_manage():
    """After ``_init_pools``, the pool must be under a kvshield allocator (e.g. unified memory pools
    build their own allocator): refused naming both."""
    assert getattr(KVCacheConfigurator._init_pools, "__kvshield_coverage__", False)
    foreign = types.SimpleNamespace(token_to_kv_pool=mha()(),
                                    token_to_kv_pool_allocator=type("UnifiedMambaTokenToKVPoolAllocator", (), {})())
    hooked = coverage._init_pools_hook(lambda self, **kw: foreign)
    with settings(accept="unified-memory") as sa:
        refused(lambda: hooked(types.SimpleNamespace(server_args=sa), sizes=None, req_to_token_pool=None,
                               token_to_kv_pool_allocator=None),
                "UnifiedMambaTokenToKVPoolAllocator", "MHATokenToKVPool")
    with settings(enable_unified_memory=True) as sa:  # SGLang's own _init_pools, unified path: named before it builds
        refused(lambda: configurator(sa, 4)._init_pools(sizes=sizes(16), req_to_token_pool=None,
                                                        token_to_kv_pool_allocator=None),
                "--enable-unified-memory", "KVSHIELD_ACCEPT_GAPS=unified-memory")


def overlapping_buffers_refused():
    """One memory registered as two buffers (a draft pool aliasing the target's K buffer) is refused."""
    with settings() as sa:
        target = mha()()
        a = build_allocator(target, 16, 4, sa)
        try:
            draft = mha(layers=1)()
            draft.k_buffer[0] = target.k_buffer[1]
            refused(lambda: build_allocator(draft, 16, 4, sa, shared=a), "target:MHATokenToKVPool.k_buffer[1]",
                    "draft1:MHATokenToKVPool.k_buffer[0]", "overlap in memory")
            assert len(a.kvshield_kvcaches()) == 1, "a refused draft leaves the allocator as it was"
            a.begin_step()
            assert a.alloc(16) is not None and a.kvshield_rank_detail.endswith("buffers=4 accepted-gaps=none")
        finally:
            a.close()


def signature_mismatch_stops_the_rank():
    class KVCacheConfigurator:  # an SGLang whose configurator renamed a parameter
        server_args = is_draft_worker = page_size = None

        def _build_token_to_kv_pool_allocator(self, *, sizes, kv_pool, is_dsv4_model, req_to_token_pool,
                                              token_to_kv_pool_allocator):
            pass

        def _init_pools(self, *, sizes, req_to_token_pool, token_to_kv_pool_allocator):
            pass

    fake = types.SimpleNamespace(KVCacheConfigurator=KVCacheConfigurator)
    refused(lambda: coverage.install(configurator=fake, builder=kv_cache_builder),
            "KVCacheConfigurator._build_token_to_kv_pool_allocator", "kv_pool", "token_to_kv_pool")


def main():
    install()
    assert sorted(ISOLATION) == sorted(coverage_cases.ISOLATION), "coverage_cases.ISOLATION lists every world"
    worlds = {f"isolation/{name}": (isolated, dict(make_pool=make, **kw)) for name, (make, kw) in ISOLATION.items()}
    worlds.update({f"twin/{name}": (twin, dict(scenario=s, adapter=a, label_part=p, named=n))
                   for name, (s, a, p, n) in coverage_cases.TWINS.items()})
    for name in coverage_cases.REFUSALS:
        worlds[name] = (globals()[name], {})
    scenarios.report(worlds)
