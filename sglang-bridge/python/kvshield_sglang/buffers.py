"""Finds every buffer that holds KV data, and refuses memory kvshield does not cover yet."""

import os

from .errors import UnsupportedFeatureError

# Gap name -> what it is. Operators accept a gap with KVSHIELD_ACCEPT_GAPS=name,name (or "all").
GAPS = {
    "hicache": "hierarchical host/storage KV cache tiers (--enable-hierarchical-cache)",
    "retraction-cpu-copy": "retraction CPU copies of KV (get_cpu_copy/load_cpu_copy)",
    "swa": "sliding-window (SWA) KV pools",
    "hybrid": "hybrid KV pools (several attention types)",
    "mamba": "Mamba/linear-attention state pools",
}


def accepted_gaps(settings=None):
    raw = (settings or {}).get("accept_gaps", os.environ.get("KVSHIELD_ACCEPT_GAPS", ""))
    names = {g.strip() for g in raw.split(",") if g.strip()}
    unknown = names - set(GAPS) - {"all"}
    if unknown:
        raise ValueError(f"unknown gap(s) {sorted(unknown)} in KVSHIELD_ACCEPT_GAPS; known: {sorted(GAPS)} or 'all'")
    return set(GAPS) if "all" in names else names


def refuse_unless_accepted(gap, accepted, where):
    if gap not in accepted:
        raise UnsupportedFeatureError(
            f"kvshield does not protect {GAPS[gap]} yet ({where}); refusing to start. "
            f"To run with this memory unprotected, set KVSHIELD_ACCEPT_GAPS={gap}")


def check_server_args(server_args, accepted):
    """Refuses SGLang features whose KV memory kvshield does not cover (unless accepted)."""
    if server_args is None:
        return
    if getattr(server_args, "enable_hierarchical_cache", False) or getattr(server_args, "hicache_storage_backend", None):
        refuse_unless_accepted("hicache", accepted, "server args enable hierarchical caching")


def check_kvcache(kvcache, accepted):
    name = type(kvcache).__name__
    for gap, marker in (("swa", "SWA"), ("hybrid", "Hybrid"), ("mamba", "Mamba")):
        if marker.lower() in name.lower():
            refuse_unless_accepted(gap, accepted, f"KV pool class {name}")


def kv_tensors(kvcache):
    """(kinds, [tensor per buffer, layer-major]) of one SGLang KV pool: K/V per layer, or the latent buffer."""
    if hasattr(kvcache, "k_buffer") and hasattr(kvcache, "v_buffer"):
        k, v = list(kvcache.k_buffer), list(kvcache.v_buffer)
        if len(k) != len(v):
            raise ValueError(f"{type(kvcache).__name__} has {len(k)} K and {len(v)} V buffers")
        return ["K", "V"], [t for pair in zip(k, v) for t in pair]
    if hasattr(kvcache, "kv_buffer"):
        return ["LATENT"], list(kvcache.kv_buffer)
    raise ValueError(f"{type(kvcache).__name__} has neither k_buffer/v_buffer nor kv_buffer: cannot find its KV memory")


def describe(kvcaches, size, page_size):
    """The pool layout of every KV pool sharing one allocator (target, then draft/speculative).

    Returns a dict: kinds, bytes_per_token (per kind), layers, addresses (data pointers: host
    addresses, or device addresses of CUDA tensors), byte_sizes, device_index, device_type.
    Every buffer must be contiguous with ``size + page_size`` token rows, the same device, and the
    same bytes per token per kind across pools.
    """
    rows = size + page_size
    kinds = None
    bpt = None
    tensors = []
    for kv in kvcaches:
        k, ts = kv_tensors(kv)
        if kinds is not None and k != kinds:
            raise UnsupportedFeatureError(f"KV pools with different layouts share one allocator ({kinds} and {k})")
        kinds = k
        for i, t in enumerate(ts):
            if not t.is_contiguous():
                raise ValueError(f"{type(kv).__name__} buffer {i} is not contiguous")
            if t.shape[0] != rows:
                raise ValueError(f"{type(kv).__name__} buffer {i} has {t.shape[0]} token rows; the allocator needs"
                                 f" size + page_size = {rows}")
            b = t.element_size() * (t.numel() // t.shape[0])
            kind = i % len(k)
            if bpt is None:
                bpt = [None] * len(k)
            if bpt[kind] is None:
                bpt[kind] = b
            elif bpt[kind] != b:
                raise UnsupportedFeatureError(
                    f"{k[kind]} buffers of {bpt[kind]} and {b} bytes per token share one allocator"
                    " (a draft model with another KV shape); kvshield needs one geometry per pool")
            tensors.append(t)
    if not tensors:
        raise ValueError("no KV buffers to protect")
    devices = {str(t.device) for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"KV buffers live on several devices: {sorted(devices)}")
    dev = tensors[0].device
    return {
        "kinds": kinds,
        "bytes_per_token": bpt,
        "layers": len(tensors) // len(kinds),
        "addresses": [t.data_ptr() for t in tensors],
        "byte_sizes": [t.numel() * t.element_size() for t in tensors],
        "device_index": -1 if dev.type == "cpu" else (dev.index or 0),
        "device_type": dev.type,
    }
