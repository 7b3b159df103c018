"""Every tensor that holds KV data at an allocator's token slots, pool class by pool class; what
kvshield does not cover is refused at start, naming the pool class and the tensor.

One adapter per SGLang KV pool class (:data:`POOL_CLASSES`, keyed by the class's module and name)
lists the tensors it registers for protection, the tensors it knows hold no KV (pointer tables,
per-layer constants) and the parts it refuses. Nothing else is trusted: every tensor a pool
instance actually holds (its attributes, lists, tuples and dicts of them, and the SGLang objects
it holds, followed recursively) must be registered, a view inside a registered buffer, empty, or
declared; anything else is refused naming it. A pool class not in the table is refused. The
operator accepts named gaps with ``KVSHIELD_ACCEPT_GAPS=name,name`` (or ``all``); what was
accepted is reported on the rank's record.

A registered buffer is a contiguous tensor whose leading dimension is the allocator's token rows
(``size + page_size``, token-major) or its pages (``rows / page_size``, page-major): either way
page ``p`` is the bytes ``[p * pageBytes, (p + 1) * pageBytes)``.
"""

import collections
import os
import re
import types
from typing import NamedTuple

from .errors import UnsupportedFeatureError

# Gap name -> what it leaves unprotected. Unknown classes and tensors get their own names:
# ``unknown-pool:Class`` and ``unknown-tensor:Class.attribute``.
GAPS = {
    "hicache": "hierarchical host/storage KV cache tiers (--enable-hierarchical-cache, --hicache-storage-backend)",
    "retraction-host-pool": "the decode server's retraction host pool (--disaggregation-decode-retraction-backup"
                            " host_pool, the default on a decode server)",
    "decode-kv-offload": "the decode server's KV offload to host (--disaggregation-decode-enable-offload-kvcache)",
    "hisparse": "hierarchical sparse attention host pools (--enable-hisparse, HiSparseDSATokenToKVPool)",
    "lmcache": "LMCache's external KV store (--enable-lmcache)",
    "unified-memory": "unified memory pools (--enable-unified-memory: one byte buffer, virtual slot ids)",
    "swa": "sliding-window (SWA) KV pools (two slot spaces: full and SWA sub-pools, SWATokenToKVPoolAllocator)",
    "mamba": "Mamba/linear-attention state pools (indexed by request slot, not token slot)",
    "dsv4": "DeepSeek-V4 compressed KV pools (SWA ring, c4/c128 pools, compressor state)",
    "dsa-layer-split": "DSA KV pools split across context-parallel ranks (LayerSplitDSATokenToKVPool)",
    "npu": "Ascend NPU KV pools",
    "kv-canary": "SGLang's KV canary buffers (--kv-canary): beside the pool, per token slot, the token id and position"
                 " of the KV there, built after the pool and never scrubbed on release",
    "disagg-staging-buffer": "the prefill/decode transfer's GPU staging buffers (SGLANG_DISAGG_STAGING_BUFFER=1,"
                             " heterogeneous TP): each transferred request's KV is copied through them and stays"
                             " there after its pages are released",
    "ngram-corpus": "NGRAM speculative decoding's n-gram corpus (--speculative-algorithm NGRAM): one per scheduler, every"
                    " request's prompt and output tails go in and every request drafts from it, so a tenant's accepted"
                    " drafts (tokens per step, latency) carry another tenant's tokens; never cleared on release",
    "memory-saver": "KV memory SGLang pauses and resumes behind the allocator (--enable-memory-saver: release/resume"
                    "_memory_occupation with the kv_cache tag): a paused page cannot be scrubbed, and a resumed one holds"
                    " whatever memory was mapped back while the pool counts it scrubbed",
    "fp4-dequant-workspace": "the FP4 KV cache's shared dequant workspace (dq_k_buffer, dq_v_buffer): FlashInfer's"
                             " extend packs each batch's KV into it from row page_size on, not at the requests' slots,"
                             " so releasing a page does not scrub the copies of its KV there",
}
UNKNOWN_POOL = "unknown-pool:"
UNKNOWN_TENSOR = "unknown-tensor:"
_INDEX = re.compile(r"[\[{]")  # where a tensor's path leaves its attribute for an item of a container


def accepted_gaps(settings=None):
    raw = (settings or {}).get("accept_gaps", os.environ.get("KVSHIELD_ACCEPT_GAPS", ""))
    names = {g.strip() for g in raw.split(",") if g.strip()}
    unknown = {n for n in names - set(GAPS) - {"all"} if not _names_an_unknown(n)}
    if unknown:
        raise ValueError(f"unknown gap(s) {sorted(unknown)} in KVSHIELD_ACCEPT_GAPS; known: {sorted(GAPS)},"
                         f" '{UNKNOWN_POOL}Class', '{UNKNOWN_TENSOR}Class.attribute' or 'all'")
    return {"all"} | set(GAPS) if "all" in names else names


def _names_an_unknown(gap):
    """Whether ``gap`` is a well-formed ``unknown-pool:Class`` or ``unknown-tensor:Class.attribute``."""
    if gap.startswith(UNKNOWN_POOL):
        return bool(re.fullmatch(r"[A-Za-z_][\w.]*", gap[len(UNKNOWN_POOL):]))
    if gap.startswith(UNKNOWN_TENSOR):
        return bool(re.fullmatch(r"[A-Za-z_][\w.]*\.[A-Za-z_]\w*", gap[len(UNKNOWN_TENSOR):]))
    return False


def _is_accepted(gap, accepted):
    return gap is not None and ("all" in accepted or gap in accepted)


def _describe_gap(gap):
    return GAPS.get(gap) or ("a KV pool class kvshield does not know" if gap.startswith(UNKNOWN_POOL)
                             else "a tensor kvshield does not know")


def refuse_unless_accepted(gap, accepted, where):
    if not _is_accepted(gap, accepted):
        raise UnsupportedFeatureError(
            f"kvshield does not protect {_describe_gap(gap)} yet ({where}); refusing to start. "
            f"To run with this memory unprotected, set KVSHIELD_ACCEPT_GAPS={gap}")


class Refusal(NamedTuple):
    """One part kvshield does not protect: its gap name (None: cannot be accepted) and what it is."""

    gap: object
    where: str


def settle(refusals, accepted):
    """Raises one UnsupportedFeatureError naming every refusal not accepted; returns the accepted ones."""
    hard = [r for r in refusals if not _is_accepted(r.gap, accepted)]
    if hard:
        parts = [f"{r.where}: {_describe_gap(r.gap) if r.gap else 'cannot be protected'}" for r in hard]
        gaps = sorted({r.gap for r in hard if r.gap})
        hint = (f" To run with this memory unprotected, set KVSHIELD_ACCEPT_GAPS={','.join(gaps)}"
                if len(gaps) == len(hard) else "")
        raise UnsupportedFeatureError("kvshield does not protect " + "; ".join(parts) + "; refusing to start." + hint)
    return sorted({r.gap for r in refusals})


def server_args_refusals(server_args):
    """The SGLang features named in ``server_args`` that keep KV where kvshield does not reach."""
    if server_args is None:
        return []
    from sglang.srt.environ import envs

    staging = getattr(envs, "SGLANG_DISAGG_STAGING_BUFFER", None)  # NOTE: read by the PD queues only
    pd_staging = getattr(server_args, "disaggregation_mode", "null") in ("prefill", "decode") and bool(
        staging is not None and staging.get())
    checks = (
        ("hicache", "--enable-hierarchical-cache", getattr(server_args, "enable_hierarchical_cache", False)),
        ("hicache", "--hicache-storage-backend", getattr(server_args, "hicache_storage_backend", None)),
        ("hisparse", "--enable-hisparse", getattr(server_args, "enable_hisparse", False)),
        ("lmcache", "--enable-lmcache", getattr(server_args, "enable_lmcache", False)),
        ("decode-kv-offload", "--disaggregation-decode-enable-offload-kvcache",
         getattr(server_args, "disaggregation_decode_enable_offload_kvcache", False)),
        ("unified-memory", "--enable-unified-memory", getattr(server_args, "enable_unified_memory", False)),
        ("retraction-host-pool", "--disaggregation-decode-retraction-backup host_pool",
         getattr(server_args, "disaggregation_decode_retraction_backup", None) == "host_pool"),
        ("disagg-staging-buffer", "--disaggregation-mode with env SGLANG_DISAGG_STAGING_BUFFER=1", pd_staging),
        ("ngram-corpus", "--speculative-algorithm NGRAM",
         str(getattr(server_args, "speculative_algorithm", None) or "").strip().upper() == "NGRAM"),
        ("memory-saver", "--enable-memory-saver", getattr(server_args, "enable_memory_saver", False)),
        ("kv-canary", f"--kv-canary {getattr(server_args, 'kv_canary', None)}",
         str(getattr(server_args, "kv_canary", None) or "none").strip().lower() != "none"),
    )
    return [Refusal(gap, f"server args {flag}") for gap, flag, on in checks if on] + _tree_cache_refusals(server_args)


def _tree_cache_refusals(server_args):
    """Tree caches whose own frees (eviction, load-back) and kept pages kvshield's hooks do not see: their
    frees would be refused (pages leak) and pages they keep released under them. Never accepted."""
    from sglang.srt.environ import envs

    from .prefix_cache import BACKEND_NAME

    backend = getattr(server_args, "radix_cache_backend", None)
    checks = (
        ("env SGLANG_EXPERIMENTAL_CPP_RADIX_TREE (RadixCacheCpp)", envs.SGLANG_EXPERIMENTAL_CPP_RADIX_TREE.get()),
        ("server args --enable-flexkv (FlexKVRadixCache)", getattr(server_args, "enable_flexkv", False)),
        (f"server args --radix-cache-backend {backend}", backend not in (None, BACKEND_NAME)),
    )
    return [Refusal(None, where) for where, on in checks if on]


def check_server_args(server_args, accepted):
    """Refuses SGLang features whose KV memory kvshield does not cover (unless accepted); returns the accepted gaps."""
    return settle(server_args_refusals(server_args), accepted)


# ---------------------------------------------------------------- the pool-class adapters


class Buffer(NamedTuple):
    """One registered buffer: its label (``role:Class.path``), BufferKind name and tensor."""

    label: str
    kind: str
    tensor: object


class _Cover:
    """What the adapters found for the pools sharing one allocator (see :func:`cover`)."""

    def __init__(self, rows, page_size):
        self.rows = rows
        self.page_size = page_size
        self.buffers = []
        self.refusals = []
        self.declared = {}  # id(tensor) -> why it holds no KV
        self.excluded = set()  # ids of objects whose whole subtree a refusal covers

    def register(self, label, kind, tensor):
        if tensor is None or tensor.numel() == 0:  # an empty placeholder (e.g. a DSA layer reusing top-k) holds nothing
            return
        self.buffers.append(Buffer(label, kind, tensor))

    def register_all(self, label, kind, tensors):
        for i, t in enumerate(tensors or ()):
            self.register(f"{label}[{i}]", kind, t)

    def declare(self, tensor, why, table=False):
        """``tensor`` holds no KV (``why``). A ``table`` (of buffer addresses or strides) has at most one
        entry per buffer of its pool, so it is recognised by that, whatever its length happens to equal."""
        if tensor is not None:
            self.declared[id(tensor)] = (why, table)

    def refuse(self, gap, label, reason="", subtree=None):
        """Refuses ``label`` (``reason`` says why); a refused ``subtree`` is named with every tensor it holds."""
        held = [p for p, _ in _tensors_of(subtree, label)] if subtree is not None else []
        shown = f" (holding {', '.join(held[:8])}{', ...' if len(held) > 8 else ''})" if held else ""
        self.refusals.append(Refusal(gap, f"{label}{shown}{reason}"))
        if subtree is not None:
            self.excluded.add(id(subtree))


_POINTER_TABLES = ("k_data_ptrs", "v_data_ptrs", "data_ptrs", "data_strides")


def _pointer_tables(pool, cov):
    for name in _POINTER_TABLES:
        cov.declare(getattr(pool, name, None), "device table of buffer addresses/strides", table=True)


def _quant_method(pool, cov):
    q = getattr(pool, "quant_method", None)
    for name in ("k_scales_gpu", "v_scales_gpu"):  # NVFP4: one global FP32 scale per layer
        cov.declare(getattr(q, name, None), "per-layer global quantisation scale (model constant)")


def _mha(pool, cov, label):
    if getattr(pool, "post_capture_active", False):
        cov.refuse(None, label, " is backed after CUDA-graph capture (SGLANG_ENABLE_POST_CAPTURE_KV_SIZING); kvshield"
                   " needs the pool's memory fixed at start: set SGLANG_ENABLE_POST_CAPTURE_KV_SIZING=0")
        return
    cov.register_all(f"{label}.k_buffer", "K", pool.k_buffer)
    cov.register_all(f"{label}.v_buffer", "V", pool.v_buffer)
    cov.register_all(f"{label}.k_scale_buffer", "SCALE", getattr(pool, "k_scale_buffer", None))
    cov.register_all(f"{label}.v_scale_buffer", "SCALE", getattr(pool, "v_scale_buffer", None))
    # NOTE: registered for the decode path's writes (at the slots), but FlashInfer's extend packs KV into the
    # workspace rows from page_size on whatever pages they are: a release cannot scrub those copies.
    workspace = [n for n in ("dq_k_buffer", "dq_v_buffer") if getattr(pool, n, None) is not None]
    for name in workspace:
        cov.register(f"{label}.{name}", "WORKSPACE", getattr(pool, name))
    if workspace:
        cov.refuse("fp4-dequant-workspace", ", ".join(f"{label}.{n}" for n in workspace),
                   " (written packed by FlashInfer's extend, not at the slots of the pages it copies)")
    _pointer_tables(pool, cov)
    _quant_method(pool, cov)


def _page_major(pool, cov, label):
    # NOTE: one byte buffer, page after page, every layer's K and V within a page: registered as
    # (pages, page bytes). k_buffer/v_buffer are strided views into it, accounted as views.
    raw, pages = pool._raw, cov.rows // cov.page_size
    cov.register(f"{label}._raw", "ENVELOPE", raw.view(pages, -1) if raw.numel() % pages == 0 else raw)
    _pointer_tables(pool, cov)
    _quant_method(pool, cov)


def _k_only(pool, cov, label):
    cov.register_all(f"{label}.k_buffer", "K", pool.k_buffer)


def _mla(pool, cov, label):
    cov.register_all(f"{label}.kv_buffer", "LATENT", pool.kv_buffer)
    cov.register_all(f"{label}.kv_scale_buffer", "SCALE", getattr(pool, "kv_scale_buffer", None))
    _pointer_tables(pool, cov)


def _dsa(pool, cov, label):
    _mla(pool, cov, label)
    cov.register_all(f"{label}.index_key_cache.buffer", "INDEX", pool.index_key_cache.buffer)


def _minimax_sparse(pool, cov, label):
    for name in ("main_pool", "index_kv_pool", "index_k_pool"):
        sub = getattr(pool, name)
        if sub is not None:
            _cover_pool(sub, cov, f"{label}.{name}")


def _hybrid_linear(pool, cov, label):
    _cover_pool(pool.full_kv_pool, cov, f"{label}.full_kv_pool")
    cov.refuse("mamba", f"{label}.mamba_pool", subtree=pool.mamba_pool)


def _refused(gap):
    def adapter(pool, cov, label):
        cov.refuse(gap, label, subtree=pool)
    return adapter


def _noop(pool, cov, label):
    cov.refuse(None, label, " holds no per-slot KV (--prefill-only-disable-kv-cache): there is nothing for kvshield"
                            " to protect; run this server without kvshield")


_MP = "sglang.srt.mem_cache.memory_pool"
_NPU = "sglang.srt.hardware_backend.npu"
# (module, class name) -> adapter. Exact classes only: a subclass may hold other tensors.
POOL_CLASSES = {
    (_MP, "MHATokenToKVPool"): _mha,
    (_MP, "MHATokenToKVPoolFP4"): _mha,
    (_MP, "MHATokenToKVPoolMXFP8"): _mha,
    (_MP, "PageMajorMHATokenToKVPool"): _page_major,
    (_MP, "NoOpMHATokenToKVPool"): _noop,
    (_MP, "MHATokenToKOnlyPool"): _k_only,
    (_MP, "MLATokenToKVPool"): _mla,
    (_MP, "MLATokenToKVPoolFP4"): _mla,
    (_MP, "DSATokenToKVPool"): _dsa,
    (_MP, "MiniMaxSparseKVPool"): _minimax_sparse,
    (_MP, "HybridLinearKVPool"): _hybrid_linear,
    ("sglang.srt.mem_cache.swa_memory_pool", "SWAKVPool"): _refused("swa"),
    ("sglang.srt.mem_cache.hisparse_memory_pool", "HiSparseDSATokenToKVPool"): _refused("hisparse"),
    ("sglang.srt.mem_cache.dsa_cache_layer_split", "LayerSplitDSATokenToKVPool"): _refused("dsa-layer-split"),
    ("sglang.srt.mem_cache.deepseek_v4_memory_pool", "DeepSeekV4TokenToKVPool"): _refused("dsv4"),
    ("sglang.srt.mem_cache.unified_memory_pool", "UnifiedMHATokenToKVPool"): _refused("unified-memory"),
    ("sglang.srt.mem_cache.unified_memory_pool", "UnifiedMLATokenToKVPool"): _refused("unified-memory"),
    ("sglang.srt.mem_cache.unified_memory_pool", "UnifiedHybridLinearKVPool"): _refused("unified-memory"),
    ("sglang.srt.mem_cache.unified_memory_pool", "UnifiedSWAKVPool"): _refused("unified-memory"),
    (f"{_NPU}.memory_pool_npu", "NPUMHATokenToKVPool"): _refused("npu"),
    (f"{_NPU}.memory_pool_npu", "NPUMLATokenToKVPool"): _refused("npu"),
    (f"{_NPU}.memory_pool_npu", "NPUMiniMaxSparseKVPool"): _refused("npu"),
    (f"{_NPU}.memory_pool_npu", "NPUMHATokenToKOnlyPool"): _refused("npu"),
    (f"{_NPU}.dsv4.dsv4_memory_pool", "DSV4NPUTokenToKVPool"): _refused("npu"),
}
_LIKE = {}  # class -> the upstream class it has the structure of (enumerate_like)


def enumerate_like(cls, upstream_name, module=_MP):
    """Declares that ``cls`` holds exactly the tensors of upstream ``module.upstream_name`` (a fork's or
    a test's stand-in), so that class's adapter covers it; every tensor it holds is still checked."""
    if (module, upstream_name) not in POOL_CLASSES:
        raise KeyError(f"{module}.{upstream_name} is not an enumerated KV pool class")
    _LIKE[cls] = (module, upstream_name)


def _adapter(pool):
    cls = type(pool)
    return POOL_CLASSES.get(_LIKE.get(cls, (cls.__module__, cls.__qualname__)))


def _cover_pool(pool, cov, label):
    adapter = _adapter(pool)
    if adapter is None:
        cls = type(pool)
        cov.refuse(f"{UNKNOWN_POOL}{cls.__name__}", label,
                   f", of class {cls.__module__}.{cls.__qualname__}, which kvshield has not enumerated", pool)
        return
    adapter(pool, cov, label)


def class_refusals(pool):
    """The refusals of ``pool``'s class and composite parts alone (no buffer is checked): what no
    allocator over it, or over its sub-pools, could protect."""
    cov = _Cover(1, 1)
    _cover_pool(pool, cov, type(pool).__name__)
    return cov.refusals


# ---------------------------------------------------------------- every tensor a pool holds


def _torch():
    import torch

    return torch


def _attrs(obj):
    d = getattr(obj, "__dict__", None)
    items = list(d.items()) if isinstance(d, dict) else []
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name) and name not in ("__dict__", "__weakref__"):
                items.append((name, getattr(obj, name)))
    return items


def _followed(value):
    """SGLang objects (and enumerated stand-ins), torch modules and plain namespaces are followed into (any
    may hold a pool's tensors); other objects hold no pool memory."""
    cls = type(value)
    if isinstance(value, type):
        return False
    return (cls.__module__.startswith("sglang.") or cls in _LIKE or isinstance(value, types.SimpleNamespace)
            or isinstance(value, _torch().nn.Module))


def _tensors_of(root, label, excluded=frozenset()):
    """(path, tensor) of every tensor reachable from ``root``: attributes, list/tuple/dict items, and
    followed objects, each object once, skipping the subtrees in ``excluded``."""
    torch = _torch()
    seen = set()
    out = []

    def walk(value, path, depth):
        if torch.is_tensor(value):
            out.append((path, value))
        elif isinstance(value, (list, tuple, collections.deque, set, frozenset, dict)):
            if id(value) in seen:  # NOTE: a container holding itself (or shared) is walked once
                return
            seen.add(id(value))
            if isinstance(value, dict):
                for k, v in value.items():
                    walk(v, f"{path}[{k!r}]", depth)
            elif isinstance(value, (set, frozenset)):
                for v in value:  # NOTE: unordered: the path names the container, its gap the attribute
                    walk(v, f"{path}{{}}", depth)
            else:
                for i, v in enumerate(value):
                    walk(v, f"{path}[{i}]", depth)
        elif (_followed(value) or depth == 0) and id(value) not in seen:
            seen.add(id(value))
            if id(value) in excluded and depth > 0:
                return
            if depth > 8:
                raise UnsupportedFeatureError(f"{path} nests SGLang objects deeper than kvshield follows; refusing to start")
            for name, v in _attrs(value):
                walk(v, f"{path}.{name}", depth + 1)

    walk(root, label, 0)
    return out


def _byte_range(t):
    """[first byte, past the last byte) a tensor touches, strides included (a strided view spans more than its numel)."""
    start = t.data_ptr()
    if not t.numel():
        return start, start
    if not callable(getattr(t, "stride", None)):  # a contiguous stand-in with no strides
        return start, start + t.numel() * t.element_size()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def _is_table(t, buffers):
    """Whether ``t`` has the shape of a table of buffer addresses or strides: one integer per buffer of its
    pool at most (a pool with fewer token rows than buffers exists only in tests)."""
    torch = _torch()
    return len(t.shape) == 1 and not t.is_floating_point() and t.dtype != torch.bool and 0 < t.shape[0] <= buffers


def _unaccounted(pool, label, cov):
    """Refusals for every tensor ``pool`` holds that is neither registered, inside a registered
    buffer, empty, nor declared."""
    registered = {id(b.tensor) for b in cov.buffers}
    ranges = [(b.tensor.device, *_byte_range(b.tensor)) for b in cov.buffers]
    refusals = []
    slot_indexed = (cov.rows, cov.rows // cov.page_size)
    # NOTE: a pool's own buffers are labelled under its label (sub-pools' too), a draft's under its own
    own_buffers = sum(1 for b in cov.buffers if b.label.startswith(label + "."))
    for path, t in _tensors_of(pool, label, frozenset(cov.excluded)):
        if id(t) in registered or t.numel() == 0:
            continue
        declared = cov.declared.get(id(t))
        if declared is not None and (not len(t.shape) or t.shape[0] not in slot_indexed):
            continue  # declared to hold no KV, and not shaped like a slot-indexed buffer
        if declared is not None and declared[1] and _is_table(t, own_buffers):
            continue  # a declared address/stride table: one integer per buffer (its length may equal the pages)
        lo, hi = _byte_range(t)
        if any(dev == t.device and a <= lo and hi <= b for dev, a, b in ranges):
            continue  # a view of protected memory
        attr = path.split(":", 1)[-1]
        refusals.append(Refusal(f"{UNKNOWN_TENSOR}{type(pool).__name__}.{_INDEX.split(attr.split('.', 1)[-1])[0]}",
                                f"{path} ({tuple(t.shape)} {t.dtype}), a tensor {type(pool).__name__} holds that"
                                " kvshield has not enumerated"))
    return refusals


def cover(kvcaches, size, page_size):
    """Every buffer to protect and every refusal for the pools sharing one allocator (target first,
    then draft pools): a list of :class:`Buffer` and a list of :class:`Refusal`."""
    cov = _Cover(size + page_size, page_size)
    refusals = []
    for i, kv in enumerate(kvcaches):
        role = "target" if i == 0 else f"draft{i}"
        label = f"{role}:{type(kv).__name__}"
        _cover_pool(kv, cov, label)
        if id(kv) not in cov.excluded:  # a wholly refused pool names its tensors in its refusal
            refusals.extend(_unaccounted(kv, label, cov))
    return cov.buffers, cov.refusals + refusals


def _bytes_per_token(buf, rows, page_size):
    t = buf.tensor
    if not t.is_contiguous():
        raise ValueError(f"{buf.label} is not contiguous")
    pages = rows // page_size
    lead = t.shape[0] if len(t.shape) else 0
    if lead not in (rows, pages) or (lead == pages and rows % page_size):
        raise ValueError(f"{buf.label} has {lead} token rows; the allocator needs size + page_size = {rows}"
                         + (f" (or {pages} pages)" if page_size > 1 else ""))
    nbytes = t.numel() * t.element_size()
    if nbytes % rows:
        raise UnsupportedFeatureError(f"{buf.label} holds {nbytes} bytes over {rows} token slots: not a whole number of"
                                      " bytes per token, so its pages cannot be named")
    return nbytes // rows


def describe(kvcaches, size, page_size, accepted=frozenset()):
    """The pool layout of every KV pool sharing one allocator (target, then draft pools), after
    refusing what is not covered (unless accepted).

    Returns a dict: per buffer ``kinds``, ``labels``, ``bytes_per_token``, ``addresses`` (data
    pointers: host addresses, or device addresses of CUDA tensors), ``byte_sizes``; and
    ``device_index``, ``device_type``, ``accepted_gaps`` (the accepted gaps these pools hit).
    """
    buffers, refusals = cover(kvcaches, size, page_size)
    hit = settle(refusals, accepted)
    rows = size + page_size
    if not buffers:
        raise UnsupportedFeatureError("no KV buffers to protect in " + ", ".join(type(k).__name__ for k in kvcaches))
    bpt = [_bytes_per_token(b, rows, page_size) for b in buffers]
    devices = {str(b.tensor.device) for b in buffers}
    if len(devices) != 1:
        raise ValueError(f"KV buffers live on several devices: {sorted(devices)}")
    spans = sorted((*_byte_range(b.tensor), b.label) for b in buffers)
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:  # NOTE: one memory registered twice would be sealed twice with different keystreams
            raise UnsupportedFeatureError(f"{first} and {second} overlap in memory; each byte of KV must belong to"
                                          " one registered buffer")
    dev = buffers[0].tensor.device
    return {
        "kinds": [b.kind for b in buffers],
        "labels": [b.label for b in buffers],
        "bytes_per_token": bpt,
        "addresses": [b.tensor.data_ptr() for b in buffers],
        "byte_sizes": [b.tensor.numel() * b.tensor.element_size() for b in buffers],
        "device_index": -1 if dev.type == "cpu" else (dev.index or 0),
        "device_type": dev.type,
        "accepted_gaps": hit,
    }
