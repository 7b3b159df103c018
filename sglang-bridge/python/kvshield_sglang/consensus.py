"""Decisions the hooks take from local observations — a transport's poll, a wall-clock deadline —
agreed across the scheduler's process group before they act, as SGLang's own disaggregation queues
agree on polls (``poll_and_all_reduce``). Acknowledging a transfer drops claims and expiring one
fails a request: both change what the pool hands out next, so every tensor-parallel rank must take
them at the same call, or the ranks' pools drift apart and collectives hang.

Every rank calls with flags for the same items in the same order (the hooks' bookkeeping is built by
the same calls on every rank). Without a group, or outside ``torch.distributed``, the local flags stand.
"""


def _reduce(flags, group, op_name):
    flags = [bool(f) for f in flags]
    if group is None or not flags:
        return flags
    import torch
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return flags
    t = torch.tensor(flags, dtype=torch.uint8)
    dist.all_reduce(t, op=getattr(dist.ReduceOp, op_name), group=group)
    return [bool(v) for v in t.tolist()]


def every_rank(flags, group):
    """True where the flag holds on every rank (a transport concluded everywhere)."""
    return _reduce(flags, group, "MIN")


def any_rank(flags, group):
    """True where the flag holds on some rank (a deadline passed on one rank's clock)."""
    return _reduce(flags, group, "MAX")


def scheduler_group(scheduler):
    """The attention tensor-parallel CPU group SGLang's scheduler agrees on polls over, if it has one."""
    group = getattr(scheduler, "attn_tp_cpu_group", None)
    if group is None:
        worker = getattr(scheduler, "tp_worker", None)
        get = getattr(worker, "get_attention_tp_cpu_group", None)
        group = get() if callable(get) else None
    return group
