"""What SGLang's decode preallocation does, as kvshield must mirror it, run in a subprocess by
``test_prealloc_pass.py`` (the plug-in replaces SGLang's classes process-wide). Built on :mod:`disagg_world`'s world
(SGLang's own prefill bootstrap queue, decode prealloc/transfer queues, ``DecodeReqToTokenPool``, ``MetadataBuffers``,
``ChunkCache``, ``release_kv_cache``; kvshield's hooks installed by the plug-in). Each oracle reads pages, page owners,
rows and metadata indices back, never only a status; each twin plants its defect back (test code only) and must fail."""

import contextlib

import torch
from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
from sglang.srt.mem_cache import common

import disagg_world as dw
import servers
from disagg_world import PAGE, World, _hog_claims
from kvshield_sglang import disagg


def _pool_state(w):
    return w.da.available_size(), w.rows.available_size(), w.dmeta_rows.available_size()


@contextlib.contextmanager
def _salvaging_only_reserved():
    """Planted bug: an interrupted pass is rebuilt from the requests kvshield reserved for, not from every request
    SGLang preallocated in it (a no-transfer request's ordinary allocation left out)."""
    salvage = disagg._salvage

    def only_reserved(queue, step, refused, args, kwargs):
        step.preallocated = [r for r in step.preallocated if step.handoff.has_reservation(r)]
        return salvage(queue, step, refused, args, kwargs)

    disagg._salvage = only_reserved
    try:
        yield
    finally:
        disagg._salvage = salvage


@contextlib.contextmanager
def _reserving_the_input_only():
    """Planted bug: a request is sized by its input alone, not by what SGLang preallocates for it."""
    fill_len = disagg._fill_len
    disagg._fill_len = lambda req: len(req.origin_input_ids)
    try:
        yield
    finally:
        disagg._fill_len = fill_len


def no_transfer_before_refused_reservation(twin=None):
    """One ``pop_preallocated`` pass: a no-transfer request N (SGLang's fake bootstrap host: warmup, health check or
    any client naming it) is preallocated, then request A's reservation is refused (no claim slot). Promised: the
    refusal aborts A alone and every request SGLang preallocated before it in the pass leaves the queue preallocated,
    once: N's pages are exactly those its row names, and after N decodes and is released, the pool, the rows and the
    metadata indices are back where they were (SGLang's rerun would otherwise preallocate N again: pages its row no
    longer names, and a first metadata index never freed)."""
    w = World(f"prealloc-nt-salvage-{twin is not None}")
    _, n = w.req("warmup", 8)
    n.bootstrap_host = FAKE_BOOTSTRAP_HOST
    pa, a = w.req("A", 8)
    w.prefill_request(pa, 20.0)
    _hog_claims(w, keep=0)  # any refusal of A's reservation (claim slots here; no room, a pool refusal alike)
    before = _pool_state(w)
    w.pre.add(n)
    w.pre.add(a)
    with twin() if twin else contextlib.nullcontext():
        preallocated, failed = w.pre.pop_preallocated()
    assert [x.req for x in failed] == [a] and a.finished_reason.status_code == 503, (failed, a.finished_reason)
    n_pages = {int(s) // PAGE for s in w.rows.req_to_token[n.req_pool_idx, :8].tolist()}
    owned = [p for p in range(w.da.size // PAGE + 1) if w.da.page_owner(p) == (n.kvshield_tenant, w.da.request_id(n))]
    assert sorted(owned) == sorted(n_pages), \
        f"no-transfer request N owns pages {sorted(owned)} but its row names only {sorted(n_pages)}: preallocated twice"
    assert [x.req for x in preallocated] == [n] and not any(d.req is n for d in w.pre.queue), "N left in the queue"
    w.tq.extend(preallocated)
    done = w.tq.pop_transferred()
    assert done == [n], done
    common.release_kv_cache(n, w.tree)
    w.da.end_step()
    after = _pool_state(w)
    assert after == before, f"(pages, rows, metadata indices) before N: {before}, after N finished: {after}"


def rebootstrap_reserves_what_sglang_preallocates(twin=None):
    """PD true-retraction rebootstrap (README: supported with ``KVSHIELD_RECOMPUTE_KEY``): a committed request R
    decodes a token and is retracted by SGLang's ``pause_generation(mode="retract")`` path (``release_req`` with no
    host copy, its last output popped, ``pd_rebootstrap_in_progress``, ``hold_rebootstrap``), then re-enqueued
    (``enqueue_held_rebootstrap`` -> ``add(is_rebootstrap=True)``) so prefill recomputes its prompt and output.
    SGLang preallocates ``len(origin_input_ids) + len(output_ids)`` slots for it (``_pre_alloc_fill_len``), the KV the
    prefill recompute sends. Promised: R is preallocated, its reservation is exactly those slots (its own pages), and
    the recompute's transfer of all of them commits: R reads exactly the recomputed bytes."""
    from types import SimpleNamespace

    from sglang.srt.managers.schedule_batch import FINISH_LENGTH, release_req

    w = World(f"prealloc-rebootstrap-{twin is not None}")
    p, d = dw.decoding_request(w)
    p.finished_reason = FINISH_LENGTH(length=1)  # the prefill server is done with R's first life
    release_req(req=d, remaing_req_count=0, server_args=SimpleNamespace(disaggregation_mode="decode"),
                req_to_token_pool=w.rows, token_to_kv_pool_allocator=w.da, tree_cache=w.tree,
                hisparse_coordinator=None, offload_kv=False)
    w.da.end_step()
    d.pd_rebootstrap_forced_output_id = d.output_ids.pop()
    d.pd_rebootstrap_in_progress = True
    w.pre.hold_rebootstrap(d)
    posted = []
    w.pre.kv_manager.submit_prefill_recompute = lambda receiver, payload: posted.append(payload)  # prefill's /generate
    d.build_rebootstrap_payload = lambda: {"input_ids": list(d.origin_input_ids) + list(d.output_ids)}
    w.pre.enqueue_held_rebootstrap()
    with twin() if twin else contextlib.nullcontext():
        preallocated, failed = w.pre.pop_preallocated()
    fill = len(d.origin_input_ids) + len(d.output_ids)
    assert [x.req for x in preallocated] == [d], (
        f"the rebootstrapped request was refused: {getattr(d.finished_reason, 'message', d.finished_reason)!r}")
    slots = w.rows.req_to_token[d.req_pool_idx, :fill].to(torch.int64)
    owners = {w.da.page_owner(int(s) // PAGE) for s in slots}
    assert owners == {(d.kvshield_tenant, w.da.request_id(d))}, owners
    # The prefill server recomputes R's input and output so far (the POSTed payload) and sends all of it.
    w.tq.extend(preallocated)
    [payload] = posted
    recompute = servers.request(d.rid, payload["input_ids"], d.kvshield_tenant, bootstrap_host=d.bootstrap_host,
                                bootstrap_port=d.bootstrap_port, bootstrap_room=d.bootstrap_room)
    expected = w.pkv.read(w.prefill_request(recompute, 100.0))
    w.send(d, -(-fill // PAGE))
    done = w.tq.pop_transferred()
    assert done == [d] and w.decode.outcome(d) == "COMMITTED", (done, d.finished_reason)
    assert torch.equal(w.dkv.read(slots), expected), "the rebootstrapped request reads bytes its recompute never sent"


SCENARIOS = {
    "nt_salvage": (no_transfer_before_refused_reservation, {}),
    "nt_salvage/only_reserved": (no_transfer_before_refused_reservation, {"twin": _salvaging_only_reserved}),
    "rebootstrap": (rebootstrap_reserves_what_sglang_preallocates, {}),
    "rebootstrap/input_only": (rebootstrap_reserves_what_sglang_preallocates, {"twin": _reserving_the_input_only}),
}


def main():
    dw.run(SCENARIOS)
