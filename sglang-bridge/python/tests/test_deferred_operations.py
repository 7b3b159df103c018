"""Queued pool operations are judged as of their calls.

A free of device indices (SGLang's usual free on a GPU: rows of ``req_to_token``) is queued, and so is every pool
operation after it until the queue reaches the pool (:meth:`resolve_frees`). An allocation that hands pages to a
holder whose holds a queued operation presents (a request's free or leftovers release, the unattributed holds'
free) resolves the queue first, so a stale free is refused and a leftovers release takes only what the request
held at its call. Checked on SGLang's real allocator classes and, for the decode server's retraction, on SGLang's
real ``release_req`` and ``DecodePreallocQueue``; each test asserts on KV bytes and page owners."""

import pytest

from conftest import require_module
from fakes import DeviceOnlyTensor, MHAPool, install_fake_cuda

torch = require_module("torch")

SETTINGS = {"level": "ZERO", "advertisedContextTokens": 32}
PS = 4


class Req:
    """A request object (the bridge keys requests by object identity, never by rid)."""

    def __init__(self, rid):
        self.rid = rid


def _paged(**settings):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(32, PS, torch.float32, "cpu", MHAPool(32, PS), False,
                                       kvshield_settings=dict(SETTINGS, **settings))


def _write(a, slots, value):
    for buf in a.get_kvcache().buffers():
        buf[slots] = value


def _read(a, slots):
    return a.get_kvcache().read(torch.as_tensor(slots, dtype=torch.int64))


def _extend(a, rows):
    """SGLang's ``alloc_extend`` for ``rows`` of (req, tenant, prefix, seq, last_loc), planned as the plug-in plans it."""
    a.set_plan([(r, t, p, s) for r, t, p, s, _ in rows])
    try:
        return a.alloc_extend(torch.tensor([p for _, _, p, _, _ in rows]), torch.tensor([p for _, _, p, _, _ in rows]),
                              torch.tensor([s for _, _, _, s, _ in rows]), torch.tensor([s for _, _, _, s, _ in rows]),
                              torch.tensor([l for _, _, _, _, l in rows]), sum(s - p for _, _, p, s, _ in rows))
    finally:
        a.clear_plan()


def test_a_queued_double_free_is_refused_before_an_allocation_gives_its_request_the_page(jvm, monkeypatch):
    """Q releases page 2; after the boundary, R's release frees Q's old slots again by device index (a double free:
    queued, R holds nothing there). R's next chunk, allocated before any boundary (as the decode prealloc plans
    one), is handed page 2. The queued free reaches the pool before that allocation: it is refused, R keeps page 2
    and reads its own KV there. Judged at the boundary instead, it was R's free of its own new page: accepted,
    R's KV scrubbed under it and the page free while R's row names it."""
    install_fake_cuda(monkeypatch)
    a = _paged()
    r, q = Req("r"), Req("q")
    out = _extend(a, [(r, "t1", 0, 4, -1), (q, "t1", 0, 4, -1)])
    sr, sq = out[:4], out[4:]
    _write(a, sr, 1.0)
    _write(a, sq, 2.0)
    with a.releasing("t1", q, leftovers=True):
        a.free(sq)
    a.end_step()
    q_page = int(sq[0]) // PS
    with a.releasing("t1", r):
        a.free(DeviceOnlyTensor(sq.tolist()))  # double free of Q's old slots, named in R's release
    chunk2 = _extend(a, [(r, "t1", 4, 8, int(sr[-1]))])  # R's next chunk, before the deferred free is resolved
    assert int(chunk2[0]) // PS == q_page  # the page the stale free names is handed to R
    _write(a, chunk2, 1.5)
    a.end_step()
    assert a.rejected_frees() == 1, "the double free of Q's released page was not refused"
    assert a.page_owner(q_page) == ("t1", a.request_id(r)), "R's live page was released by the stale free"
    assert torch.all(_read(a, chunk2) == 1.5).item(), "R's own KV was scrubbed under it"


def test_a_queued_leftovers_release_takes_only_what_the_request_held_at_its_call(jvm, monkeypatch):
    """R holds pages 1-2; its release frees page 1 by device index (queued) and queues its leftovers release
    (page 2), which releases what R holds when it reaches the pool. R is allocated two new pages before the
    boundary (a retracted request resumed by the decode prealloc): the release reaches the pool first, so R keeps
    its new pages and their KV. Run at the boundary instead, it released them under R."""
    install_fake_cuda(monkeypatch)
    a = _paged()
    r = Req("r")
    s = _extend(a, [(r, "t1", 0, 8, -1)])
    _write(a, s, 9.0)
    with a.releasing("t1", r, leftovers=True):  # e.g. its retraction: the row freed by device index
        a.free(DeviceOnlyTensor(s[:4].tolist()))
    assert a.pending_frees() > 0
    s2 = _extend(a, [(r, "t1", 0, 8, -1)])  # R resumed: planned, before the deferred release is resolved
    _write(a, s2, 5.0)
    new_pages = sorted({int(x) // PS for x in s2})
    a.end_step()
    assert [a.page_owner(p) for p in new_pages] == [("t1", a.request_id(r))] * 2, \
        "R's pages allocated after its release were released by its queued leftovers"
    assert torch.all(_read(a, s2) == 5.0).item(), "R's new KV was scrubbed under it"


# ------------------------------------------------------------------ the decode server's retraction, on SGLang's code

def _device_frees(w):
    """The decode server's ``req_to_token`` rows live on the GPU, so every free SGLang makes names device indices:
    the allocator's ``free``/``free_segment`` get the repository's device stand-in (``fakes.DeviceOnlyTensor``)
    carrying the same values, and the bridge's CUDA module is ``fakes.FakeCuda`` (this machine has no GPU)."""
    from kvshield_sglang import launch_fence

    import fakes

    cuda = fakes.FakeCuda()
    fakes.IN_FLIGHT.clear()
    launch_fence.torch_cuda = lambda: cuda
    free, free_segment = w.da.free, w.da.free_segment

    def dev(t):
        return fakes.DeviceOnlyTensor(t.reshape(-1).tolist()) if isinstance(t, torch.Tensor) else t

    w.da.free = lambda idx: free(dev(idx))
    w.da.free_segment = lambda idx, *, start_pos: free_segment(dev(idx), start_pos=start_pos)


def retraction_resumed_before_the_next_boundary():
    """SGLang's decode server under memory pressure (``update_running_batch``): request D (committed handoff) is
    retracted and resumed once (its handoff finishes at that first row free, as kvshield's hook does), decodes a
    token, and is retracted again: ``retract_decode`` retracts D (``release_req``: host copy, then
    ``release_kv_cache`` of its row, by device index) and then aborts the last request, which empties the batch,
    so ``prepare_for_decode`` (``alloc_for_decode``: ``begin_step``) does not run this iteration. The next
    iteration's ``process_decode_queue`` resumes D first (``resume_retracted_reqs``: ``_pre_alloc``, planned by
    kvshield's prealloc hook, the host copy loaded back). At the next step boundary D must still hold its pages
    and read its own KV."""
    from types import SimpleNamespace

    import disagg_world as dw
    from sglang.srt.managers.schedule_batch import release_req

    w = dw.World("deferred-retract")
    w.rows.req_to_token = w.rows.req_to_token.as_subclass(dw.Int32Rows)
    p, d = w.req("r", 10)
    w.prefill_request(p, 100.0)
    w.decode_request(d)
    w.send(d, 3)
    view = w.client_view(d, w.tq.pop_transferred())
    assert view[0] == 200, view[:2]
    w.decode_token(d, 10, w.decode_slots(d)[-1:], value=110.0, token=8)
    w.da.end_step()
    _device_frees(w)

    def retract():
        assert release_req(req=d, remaing_req_count=0, server_args=SimpleNamespace(disaggregation_mode="decode"),
                           req_to_token_pool=w.rows, token_to_kv_pool_allocator=w.da, tree_cache=w.tree,
                           hisparse_coordinator=None)
        w.pre.add(d, is_retracted=True)

    def resume():
        assert w.pre.resume_retracted_reqs() == [d]
        return w.rows.req_to_token[d.req_pool_idx, :d.kv_committed_len].to(torch.int64)

    # Its first retraction and resumption, a step boundary between them: as disagg_world's retracted_resumed.
    retract()
    w.da.end_step()
    slots = resume()
    w.da.end_step()
    # It decodes a token (position 11) and is retracted again in iteration k; the last request is then aborted and
    # the batch is empty: no begin_step. Iteration k + 1's process_decode_queue resumes it before anything crosses.
    w.da.begin_step()
    w.decode_token(d, 11, slots[-1:], value=120.0, token=9)
    expected = w.dkv.read(w.rows.req_to_token[d.req_pool_idx, :12].to(torch.int64)).clone()
    w.da.end_step()
    retract()
    slots = resume()
    assert torch.equal(w.dkv.read(slots), expected), "the resumed request's host copy was not loaded back"
    w.da.end_step()  # the next step boundary (alloc_for_decode's begin_step)
    owners = sorted({w.da.page_owner(int(s) // dw.PAGE) for s in slots}, key=str)
    # Another tenant's request is then allocated what the pool has free and writes its KV.
    other = f"{w.tag}-other"
    w.da.set_plan([(other, "t2", 0, w.da.available_size())])
    theirs = w.da.alloc(w.da.available_size())
    w.da.clear_plan()
    for b in w.dkv.buffers():
        b[theirs] = -5.0
    seen = w.dkv.read(slots)
    assert owners == [(d.kvshield_tenant, w.da.request_id(d))] and torch.equal(seen, expected), (
        f"the resumed request's pages were released by its retraction's queued release (owners {owners}); tenant t2"
        f" was then handed {sorted({int(x) // dw.PAGE for x in theirs} & {int(x) // dw.PAGE for x in slots})} of them"
        f" and the resumed request reads {sorted(set(seen.flatten().tolist()))} where it wrote"
        f" {sorted(set(expected.flatten().tolist()))}")


def main():
    import scenarios
    import servers
    import wire
    from kvshield_sglang import plugin

    plugin.load()
    wire.install()
    servers.one_process_group()
    with servers.single_rank():
        servers.publish_server_args(attention_backend="torch_native", disaggregation_decode_retraction_backup="cpu_tensor")
        scenarios.report({"retraction_resumed": (retraction_resumed_before_the_next_boundary, {})})


@pytest.fixture(scope="module")
def decode_results(jvm, tmp_path_factory):
    import scenarios
    from conftest import TEST_CLASSES

    code = "import test_deferred_operations as t; t.main()"
    return scenarios._reported(scenarios.run(scenarios.script(code), tmp_path_factory.mktemp("ranks"), TEST_CLASSES),
                               scenarios._MARK)


def test_a_decode_request_resumed_before_the_next_boundary_keeps_its_reloaded_pages(decode_results):
    """On SGLang's real decode server code (``disagg_world``: SGLang's ``release_req``,
    ``DecodePreallocQueue.add``/``resume_retracted_reqs``, kvshield's hooks), from a request's second retraction
    on (its first row free finishes its handoff, a crossing that resolves the queue; later ones do not):
    ``retract_decode`` aborts the last request when even it cannot fit, the batch is empty and
    ``update_running_batch`` returns before ``prepare_for_decode``, so no ``begin_step`` runs before the next
    iteration's ``process_decode_queue`` resumes the retracted request (``_pre_alloc``, planned by kvshield's
    prealloc hook without a boundary). The retraction's queued release reaches the pool before that allocation:
    after the next boundary the request still holds its pages and reads its reloaded KV, also after another
    tenant was handed everything free. Run at the boundary instead, it released them: that tenant's writes landed
    in the resumed request's KV."""
    import scenarios

    scenarios.passes(decode_results, "retraction_resumed")


def test_a_queued_unattributed_free_is_refused_before_an_unplanned_allocation_gets_the_page(jvm, monkeypatch):
    """The unattributed holds: pages allocated with no plan are the unattributed holder's, and a
    free outside any release presents that holder's holds. A stale device free of released slots, queued, then an
    unplanned allocation that is handed those slots' page again: the free reaches the pool first and is refused, the
    allocation keeps its page and its bytes."""
    install_fake_cuda(monkeypatch)
    a = _paged()
    first = a.alloc(PS)
    a.free(first)  # host slots, no release: the unattributed pages' own free, applied now
    a.end_step()
    a.free(DeviceOnlyTensor(first.tolist()))  # the same slots again, by device index: queued
    assert a.pending_frees() == 1
    second = a.alloc(PS)
    assert int(second[0]) // PS == int(first[0]) // PS  # the page the stale free names, handed out again
    _write(a, second, 3.0)
    a.end_step()
    assert a.rejected_frees() == 1, "the stale free was not refused"
    assert a.page_owner(int(second[0]) // PS) is not None, "the unplanned allocation's page was released under it"
    assert torch.all(_read(a, second) == 3.0).item(), "the unplanned allocation's KV was scrubbed under it"
