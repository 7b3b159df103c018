"""The transfers of the PD handoff through the real SGLang classes: a prefill send's claims, deadline and alarm
across client aborts, chunked prefills and SGLang's own release of the request (prefill side), and a decode commit
that takes only its own transfer's pages and metadata row while a room or index is reused (decode side).

Each test's docstring names the promise it checks, what happened before its fix, the severity and the cause; each
twin plants the defect back and must fail. The scenarios run in a subprocess on the real SGLang (this module is
imported there and :func:`main` called), through ``prefill_world``/``disagg_world``, as the other PD tests do.
"""

import contextlib
import os

import pytest

from conftest import TEST_CLASSES
import scenarios
from scenarios import fails, passes


# ------------------------------------------------------------------------------------------- subprocess side

def _upstream_chunked_abort(s, req):
    """SGLang's own ``Scheduler.process_pending_chunked_abort`` (a client abort of the request being chunk-prefilled,
    recorded by ``abort_request`` as ``_pending_chunked_abort_req``) run on the prefill world's scheduler state."""
    import types

    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.managers.scheduler import Scheduler as SGLangScheduler

    s.disaggregation_mode = DisaggregationMode.PREFILL
    s.enable_hicache_storage = False
    s.ipc_channels = types.SimpleNamespace(send_to_tokenizer=types.SimpleNamespace(send_output=lambda *a, **k: None))
    s._pending_chunked_abort_req = req
    s.chunked_req = req
    SGLangScheduler.process_pending_chunked_abort(s)


@contextlib.contextmanager
def _planted_sweep(twin):
    """Planted bugs of the sweep itself (test code only), undone afterwards: ``tracks_queued_only`` polls only the
    sends whose request SGLang's inflight queue still holds (the class of the chunked-abort leak)."""
    from kvshield_sglang import disagg_prefill

    tracked = disagg_prefill._tracked
    if twin == "tracks_queued_only":
        def queued_only(scheduler, sends):
            queued = {id(r) for r in scheduler.disagg_prefill_inflight_queue}
            return [send for send in tracked(scheduler, sends) if id(send.req) in queued]

        disagg_prefill._tracked = queued_only
    try:
        yield
    finally:
        disagg_prefill._tracked = tracked


class _ExpiresQueuedOnly:
    """Planted bug (test code only, the class of the early room release): an overdue send is expired only while SGLang's inflight
    queue still holds its request."""

    def __init__(self, real, scheduler):
        self.real, self.scheduler = real, scheduler

    def __getattr__(self, name):
        return getattr(self.real, name)

    def expire(self, rid):
        if any(r is rid for r in self.scheduler.disagg_prefill_inflight_queue):
            self.real.expire(rid)


def chunked_abort_after_a_sent_chunk(twin=None):
    """A (20 tokens, 8-token chunks) has its first chunk sent by SGLang's ``process_prefill_chunk`` (2 pages
    reader-claimed), then the client aborts it: SGLang's ``process_pending_chunked_abort`` aborts the sender
    (poll -> Failed), releases A's KV and drops A (it never reaches the inflight queue). The transport concluded,
    so A's claims must drop, its pages come back scrubbed and its room must be free again."""
    with _planted_sweep(twin):
        _chunked_abort_after_a_sent_chunk(5151 if twin is None else 5161)  # rooms are process-wide: one per run


def _chunked_abort_after_a_sent_chunk(room):
    import torch
    from sglang.srt.disaggregation.base import KVPoll
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    import prefill_world as pw
    from kvshield_sglang import disagg, disagg_prefill
    from kvshield_sglang.errors import HandoffError

    os.environ[disagg_prefill.SEND_TIMEOUT] = "0"  # any deadline has long passed
    s = pw.Scheduler()
    sends = disagg_prefill.sends_of(s)
    full = s.alloc.available_size()
    a = s.request("a", 20)
    a.bootstrap_room = room
    disagg.PREFILL_ROOMS.claim(a)  # what the hooked bootstrap queue's add does
    s.compute(a, pw.CHUNK, 100.0)
    s.chunked_req = a
    s.process_prefill_chunk(None, s.running_batch)
    assert sends.claimed_pages(a) == 2, sends.claimed_pages(a)
    _upstream_chunked_abort(s, a)
    assert isinstance(a.finished_reason, FINISH_ABORT) and a.disagg_kv_sender.poll() == KVPoll.Failed
    for _ in range(3):  # SGLang's event loop keeps polling the inflight queue; the transport has concluded
        s.process_disagg_prefill_inflight_queue()
        disagg_prefill.sweep(s, sends)
        s.step()
    problems = []
    if sends.has_send(a) or sends.active():
        problems.append(f"A's send is still active ({sends.active()} active, {sends.claimed_pages(a)} pages claimed)")
    if s.alloc.available_size() != full:
        problems.append(f"only {s.alloc.available_size()} of {full} slots are available: A's pages never came back")
    if (sends.has_send(a) or sends.active()) and not sends.alarms():
        problems.append("no alarm was raised either")  # NOTE: a held send is never silent; a concluded one is no alarm
    b = s.request("b", 4)
    b.bootstrap_room = room
    try:
        disagg.PREFILL_ROOMS.claim(b)
    except HandoffError as e:
        problems.append(f"a new request on A's room is refused: {e}")
    assert not problems, "; ".join(problems)
    del torch


def released_send_never_concludes(twin=None):
    """A is aborted right after its last chunk went to the transport (its grammar rejects the token: SGLang releases
    its KV at once and drops it from the inflight queue). Its sender then never concludes. Past the deadline (0 s)
    the send must be expired with an alarm, as for a request still queued."""
    import prefill_world as pw
    from sglang.srt.managers.schedule_batch import FINISH_ABORT

    from kvshield_sglang import disagg_prefill

    os.environ[disagg_prefill.SEND_TIMEOUT] = "0"
    s = pw.Scheduler(twin)
    sends = disagg_prefill.sends_of(s)
    a = s.request("a", 12)
    s.prefill(a, 100.0, grammar=pw._Grammar())
    assert isinstance(a.finished_reason, FINISH_ABORT) and s.disagg_prefill_inflight_queue == []
    for _ in range(3):
        s.process_disagg_prefill_inflight_queue()
        disagg_prefill.sweep(s, sends)
        s.step()
    assert sends.alarms(), (f"A's sender never concluded, past the 0 s deadline, yet no alarm ({sends.active()} send "
                            f"active, {sends.claimed_pages(a)} pages claimed)")


def overdue_mid_chunked_prefill():
    """A (20 tokens, 8-token chunks) has its first chunk sent and SGLang still chunk-prefills it when the deadline
    (0 s, counted from that chunk) passes: the send is expired (alarm, claims fenced) and A failed (500) while SGLang
    still holds it, so its next chunk never reaches the transport; once its sender concludes the claims drop and its
    room is free."""
    from sglang.srt.disaggregation.base import KVPoll

    import prefill_world as pw
    from kvshield_sglang import disagg, disagg_prefill

    os.environ[disagg_prefill.SEND_TIMEOUT] = "0"
    s = pw.Scheduler()
    sends = disagg_prefill.sends_of(s)
    a = s.request("a", 20)
    a.bootstrap_room = 5252
    disagg.PREFILL_ROOMS.claim(a)
    s.compute(a, pw.CHUNK, 100.0)
    s.chunked_req = a
    s.process_prefill_chunk(None, s.running_batch)
    s.process_disagg_prefill_inflight_queue()  # A is not queued: SGLang is still prefilling it
    assert len(sends.alarms()) == 1 and "never concluded" in sends.alarms()[0], sends.alarms()
    assert a.finished_reason is not None and a.finished_reason.status_code == 500, a.finished_reason
    assert sends.has_send(a) and sends.claimed_pages(a) == 2, "the overdue send's claims were dropped"
    s.compute(a, 16, 100.0)
    s.send_kv_chunk(a)
    assert len(a.disagg_kv_sender.pages) == 2, f"a chunk after the expiry reached the transport: {a.disagg_kv_sender.pages}"
    a.disagg_kv_sender.state = KVPoll.Failed  # the transport drains after all
    disagg_prefill.sweep(s, sends)
    assert not sends.has_send(a) and sends.active() == 0
    b = s.request("b", 4)
    b.bootstrap_room = 5252
    disagg.PREFILL_ROOMS.claim(b)


@contextlib.contextmanager
def _planted(*bugs):
    """Plants defects back (the twins): ``room-freed-at-give-up`` (the decode room freed when the decode side gives
    up, not when the transfer is acknowledged), ``row-unbound`` (a metadata index goes back to SGLang at once and a
    row is accepted by room and tenant alone), ``refused-row-acknowledges`` (reading a row, refused or not, is the
    acknowledgement), ``no-transfer-row-kept`` (a no-transfer request's metadata row is not cleared)."""
    from kvshield_sglang import disagg, transport

    saved = []

    def put(owner, name, value):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    if "room-freed-at-give-up" in bugs:
        put(disagg, "_forget", lambda req, handoff=None: disagg._free_room(req))
    if "row-unbound" in bugs:
        real_row = transport.MetadataTransport.row

        def unbound_row(self, receiver, rid):
            state = receiver._kvshield_row
            if state.index is not None:
                state.foreign, state.owners[state.index] = False, state
            return real_row(self, receiver, rid)

        put(transport, "hold_indices", lambda allocator, metadata_buffers: True)
        put(transport.MetadataTransport, "row", unbound_row)
    if "refused-row-acknowledges" in bugs:
        checked_row = transport.MetadataTransport.row

        def acknowledging_row(self, receiver, rid):
            if getattr(receiver, "_kvshield_row", None) is not None and receiver._kvshield_row.index is not None:
                receiver._kvshield_row.landed = True
            return checked_row(self, receiver, rid)

        put(transport.MetadataTransport, "row", acknowledging_row)
    if "no-transfer-row-kept" in bugs:
        put(transport, "clear_rows_at_send", lambda receiver, req, metadata_buffers: None)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def room_reused_while_aborted_transfer_in_flight(level="ZERO", rows=1, planted=()):
    with _planted(*planted):
        _room_reused_while_aborted_transfer_in_flight(f"{level}-{rows}-{'-'.join(planted)}", level, rows)


def _room_reused_while_aborted_transfer_in_flight(tag, level, rows):
    """Decode request A (tenant t1, room R, Mooncake: coverage in the metadata row) gets its first chunk, then the
    decode side gives up on it (client abort: its receiver aborted, Failed): A is aborted (500), its pages stay
    quarantined (A's transfer is unacknowledged: prefill may still be writing), but ``_forget`` frees room R and
    SGLang frees A's metadata index. Request B of the same tenant on room R (routed to another prefill server) is
    admitted, reserves pages, gets the same metadata index (its row cleared at ``send_metadata``) and waits for its
    prefill. A's prefill, still alive, sends its last chunk: the KV lands in A's own quarantined pages, its metadata
    (SGLang's rows and kvshield's row: room R, 8 tokens, tenant t1) lands at A's index, now B's, and prefill's
    Success message names room R, which Mooncake's decode manager keys its status by
    (``MooncakeKVManager.update_status(bootstrap_room, Success)``; ``CommonKVReceiver.poll`` reads
    ``check_status(self.bootstrap_room)``). B must not decode: nothing of B's prompt was ever written into its pages."""
    import torch

    import disagg_world as dw
    import wire
    from sglang.srt.mem_cache import common

    w = dw.MooncakeWorld(f"a16-room-{tag}", metadata_rows=rows, level=level)
    pa, a = w.req("A", 8)
    w.prefill_request(pa, 30.0)
    w.decode_request(a)
    route_a = wire.ROUTES[a.bootstrap_room]
    w.send_chunk(pa, end_idx=4)  # A's first page lands
    w.tq.queue[0].kv_receiver.abort()  # the client gives up on A
    assert w.tq.pop_transferred() == [] and a.finished_reason.status_code == 500
    pb, b = w.req("B", 8)
    b.bootstrap_room = pb.bootstrap_room = a.bootstrap_room  # the same room (a client retry, or a collision)
    b.bootstrap_host = pb.bootstrap_host = "10.0.0.9"  # B's prefill server is another one
    preallocated, failed = w.decode_request(b)
    if b not in [d.req for d in preallocated]:
        # the fix: A's room is busy until A's transfer is acknowledged or expired (B refused, 400), or, past the room
        # table, A's metadata index is held until then (B waits in the prealloc queue for one)
        if b.finished_reason is not None:
            assert b.finished_reason.status_code == 400 and "bootstrap room" in b.finished_reason.message, \
                b.finished_reason
            return
        assert any(d.req is b for d in w.pre.queue) and w.dmeta_rows.available_size() == 0, "B vanished"
        wire.ROUTES[a.bootstrap_room] = route_a
        w.send_chunk(pa, last=True)  # A's late completion: its metadata at A's own (held) index
        assert w.decode_request(b)[0] == [] and b.finished_reason is None, "B took A's held metadata index"
        return
    receiver_b = w.receiver(b)
    bslots = w.decode_slots(b)
    for buf in w.dkv.buffers():
        buf[bslots] = -9.0  # whatever B's pages hold before B's transfer writes them (residue under NONE)
    wire.ROUTES[a.bootstrap_room] = route_a  # A's prefill server still holds A's TransferInfo for room R
    w.send_chunk(pa, last=True)  # A's late last chunk: KV into A's pages, metadata at A's (now B's) index
    receiver_b.landed = True  # prefill's Success for room R: Mooncake's decode status is keyed by room
    done = w.tq.pop_transferred()
    if b not in done and b.finished_reason is None:
        # B's own metadata index: SGLang's readiness gate (the room in B's row) waits for B's own transfer
        assert any(d.req is b for d in w.tq.queue), "B vanished"
        return
    view = w.client_view(b, done)
    assert view[0] != 200, (f"B (room reused while A's transfer was unacknowledged) decoded with HTTP 200 over pages its "
                            f"own transfer never wrote: {view[2][0, :, 0, 0].tolist()}")
    assert view[0] == 500, view[:2]
    del torch


def refused_on_a_foreign_success_releases_pages_its_own_transfer_still_writes(planted=()):
    # NOTE: the room table's fix planted away (the room freed at give-up, the metadata index and row unbound) to reach a
    # refusal on a foreign Success at all: this scenario isolates the acknowledgement.
    with _planted("room-freed-at-give-up", "row-unbound", *planted):
        _refused_on_a_foreign_success("-".join(planted))


def _refused_on_a_foreign_success(tag):
    """As in the room-reuse scenario, but B is tenant t2 (A is t1): A's late completion (Success for room R, A's row at
    the reused index) reaches B, whose commit is refused for the tenant mismatch (good). Reading the row marked B's
    receiver ``landed``, so B is acknowledged: its writer claims drop and its pages are scrubbed and handed to C
    (tenant t3). B's own transfer, from B's prefill server, was never concluded: it now lands B's prompt into those
    pages. C must never read tenant t2's KV."""
    import torch

    import disagg_world as dw
    import wire
    from kvshield_sglang import disagg

    w = dw.MooncakeWorld(f"a16-xt-{tag}", metadata_rows=1)
    pa, a = w.req("A", 8, tenant="t1")
    w.prefill_request(pa, 30.0)
    w.decode_request(a)
    route_a = wire.ROUTES[a.bootstrap_room]
    w.send_chunk(pa, end_idx=4)
    w.tq.queue[0].kv_receiver.abort()
    assert w.tq.pop_transferred() == [] and a.finished_reason.status_code == 500
    pb, b = w.req("B", 8, tenant="t2")
    b.bootstrap_room = pb.bootstrap_room = a.bootstrap_room
    b.bootstrap_host = pb.bootstrap_host = "10.0.0.9"
    preallocated, _ = w.decode_request(b)
    assert [d.req for d in preallocated] == [b], f"B was not admitted on A's room: {b.finished_reason}"
    route_b, receiver_b = wire.ROUTES[b.bootstrap_room], w.receiver(b)
    b_pages = {int(x) // dw.PAGE for x in w.decode_slots(b).tolist()}
    wire.ROUTES[a.bootstrap_room] = route_a
    w.send_chunk(pa, last=True)  # A's late completion: its row at the reused index, Success for room R
    receiver_b.landed = True
    assert w.tq.pop_transferred() == [] and b.finished_reason.status_code == 500, b.finished_reason
    disagg.sweep(w.decode)
    w.da.end_step()
    n = w.da.available_size()
    w.da.set_plan([(f"a16-xt-{tag}-C", "t3", 0, n)])
    cslots = w.da.alloc(n)
    w.da.clear_plan()
    for buf in w.dkv.buffers():
        buf[cslots] = 5.0  # C's own KV
    c_pages = {int(x) // dw.PAGE for x in cslots.tolist()}
    assert not b_pages & c_pages, (f"B's pages handed out while B's transfer is unacknowledged (C got "
                                   f"{sorted(b_pages & c_pages)})")
    disagg.PREFILL_ROOMS.release(pa)  # A's sender concluded on its prefill server
    w.prefill_request(pb, 70.0)  # B's own prefill (its server: 10.0.0.9) now sends
    wire.ROUTES[b.bootstrap_room] = route_b
    w.send_chunk(pb, last=True)
    seen = w.dkv.read(cslots)
    leaked = torch.count_nonzero((seen >= 70.0) & (seen < 78.0)).item()
    assert leaked == 0, (f"tenant t3's pages {sorted(b_pages)} now hold tenant t2's prompt KV ({leaked} values): B's "
                         "reservation was acknowledged on another transfer's Success and released under its own "
                         "still-running transfer")


def no_transfer_reads_previous_tenants_metadata_row(planted=()):
    with _planted(*planted):
        _no_transfer_reads_previous_tenants_metadata_row("-".join(planted))


def _no_transfer_reads_previous_tenants_metadata_row(tag):
    """Tenant t2's request A is handed off over Mooncake and decodes (first output token 31337, computed by prefill from
    t2's prompt); its metadata index goes back to SGLang. A no-transfer request W of tenant t1 (SGLang's fake bootstrap
    host: warmup, health check, or any client naming it) is admitted: kvshield gives it fresh zeroed pages, but SGLang
    commits W's "transfer" from the metadata row at its index (``_commit_transfer_to_req``; the room check is skipped
    for fake transfers). W must not start decoding from t2's first token."""
    from sglang.srt.disaggregation.utils import FAKE_BOOTSTRAP_HOST
    from sglang.srt.mem_cache import common

    import disagg_world as dw

    w = dw.MooncakeWorld(f"a16-nt-meta-{tag}", metadata_rows=1)
    pa, a = w.req("A", 8, tenant="t2")
    w.prefill_request(pa, 10.0)
    w.decode_request(a)
    pa.output_ids[-1] = 31337  # t2's first sampled token, set into the metadata by the last chunk
    w.send_chunk(pa, last=True)
    done = w.tq.pop_transferred()
    assert a in done and list(a.output_ids) == [31337], (done, list(a.output_ids))
    common.release_kv_cache(a, w.tree)
    w.da.end_step()
    _, d = w.req("warmup", 8, tenant="t1")
    d.bootstrap_host = FAKE_BOOTSTRAP_HOST
    w.decode_request(d)
    done = w.tq.pop_transferred()
    status = w.client_view(d, done)[0]
    assert not (status == 200 and 31337 in list(d.output_ids)), (
        f"tenant t1's no-transfer request decodes (HTTP {status}) from tenant t2's first output token: output_ids "
        f"{list(d.output_ids)}, cached_tokens {d.cached_tokens}")


SCENARIOS = {
    "prefill": {
        "chunked_abort_after_a_sent_chunk": (chunked_abort_after_a_sent_chunk, {}),
        "chunked_abort_after_a_sent_chunk/tracks_queued_only": (chunked_abort_after_a_sent_chunk,
                                                                  {"twin": "tracks_queued_only"}),
        "released_send_never_concludes": (released_send_never_concludes, {}),
        "released_send_never_concludes/expires_queued_only": (released_send_never_concludes,
                                                              {"twin": _ExpiresQueuedOnly}),
        "overdue_mid_chunked_prefill": (overdue_mid_chunked_prefill, {}),
    },
    "decode": {
        "room_reused_while_aborted_transfer_in_flight": (room_reused_while_aborted_transfer_in_flight, {}),
        "room_reused_past_the_room_table": (room_reused_while_aborted_transfer_in_flight,
                                            {"planted": ("room-freed-at-give-up",)}),
        "room_reused_past_the_room_table_two_rows": (room_reused_while_aborted_transfer_in_flight,
                                                     {"rows": 2, "planted": ("room-freed-at-give-up",)}),
        "room_reused_twin_room_and_row_unbound": (room_reused_while_aborted_transfer_in_flight,
                                                  {"planted": ("room-freed-at-give-up", "row-unbound")}),
        "refused_on_a_foreign_success_releases_pages_its_own_transfer_still_writes": (
            refused_on_a_foreign_success_releases_pages_its_own_transfer_still_writes, {}),
        "refused_on_a_foreign_success_twin_refused_row_acknowledges": (
            refused_on_a_foreign_success_releases_pages_its_own_transfer_still_writes,
            {"planted": ("refused-row-acknowledges",)}),
        "no_transfer_reads_previous_tenants_metadata_row": (no_transfer_reads_previous_tenants_metadata_row, {}),
        "no_transfer_twin_row_kept": (no_transfer_reads_previous_tenants_metadata_row,
                                      {"planted": ("no-transfer-row-kept",)}),
    },
}


def main(world):
    import scenarios
    import servers
    from kvshield_sglang import plugin

    plugin.load()
    if world == "decode":
        import wire

        wire.install()
    servers.one_process_group()
    with servers.single_rank():
        if world == "decode":
            servers.publish_server_args(attention_backend="torch_native",
                                        disaggregation_decode_retraction_backup="cpu_tensor")
        else:
            servers.publish_server_args(attention_backend="torch_native")
        scenarios.report(SCENARIOS[world])


# ------------------------------------------------------------------------------------------------ the tests

def _world(name, tmp_path_factory):
    code = f"import test_disagg_transfers as t; t.main({name!r})"
    return scenarios._reported(scenarios.run(scenarios.script(code), tmp_path_factory.mktemp("ranks"), TEST_CLASSES),
                               scenarios._MARK)


@pytest.fixture(scope="module")
def results(jvm, tmp_path_factory):
    return _world("prefill", tmp_path_factory)


@pytest.fixture(scope="module")
def decode_results(jvm, tmp_path_factory):
    return _world("decode", tmp_path_factory)


def test_client_abort_of_a_chunked_prefill_after_a_sent_chunk_leaks_claims_pages_and_room(results):
    """Promise (README "Prefill sends": "a send whose sender polls Success or Failed (the transport reads no more)
    drops its claims ... whether SGLang releases the request's KV before that (an abort: the pages stay quarantined
    ... until the claims drop)"; a sender that has not concluded by the deadline is expired with an alarm; "the room is
    free once the first one's sender concluded"; every failure leaves the pool as it was).
    What happens: a client aborts a request during chunked prefill after one chunk went to the transport. SGLang's
    real path (``Scheduler.process_pending_chunked_abort``) aborts the sender (poll -> Failed), releases the KV and
    drops the request without it ever entering ``disagg_prefill_inflight_queue``. kvshield's send record keeps
    ``last_sent_at = None`` (set only on the last chunk), so ``disagg_prefill.sweep`` never polls it: the claims never
    drop, the pages stay quarantined forever (``available_size()`` short), no expiry, no alarm, the ``Req`` is kept
    in ``PrefillSends.sends`` and its bootstrap room stays busy in ``PREFILL_ROOMS`` for the process lifetime (every
    later request on that room refused 400). Repeating the abort drains the prefill pool: an unauthenticated client
    DoS of the prefill server, and a silent leak no alarm reports.
    Severity: high (permanent page/claim/room leak from an ordinary client abort; pool never returns to its state).
    Cause: disagg_prefill.py:sweep (only sends with ``last_sent_at`` set are polled) with
    _wrap_send_kv_chunk (``last_sent_at`` set only for ``last_chunk``); no hook on SGLang's chunked-abort path."""
    passes(results, "chunked_abort_after_a_sent_chunk")


def test_room_freed_while_an_aborted_transfer_is_unacknowledged_lets_its_late_completion_commit_another_request(
        decode_results):
    """Promise (README "Prefill→decode handoffs": a decode request reads only pages whose transfer landed, never
    residue; "Each server also refuses (400) a request whose bootstrap room another of its live requests holds:
    SGLang's transports key a transfer by room alone"; claims fence in-flight transfers; a failed transfer over the
    metadata transports "is never acknowledged (prefill may still be writing)").
    What happens: when the decode side gives up on A (client abort, transfer failure, commit refusal),
    ``disagg._wrap_release``/``_wrap_pop``/``_wrap_pop_preallocated`` call ``_forget(req)``, which frees A's room in
    ``DECODE_ROOMS`` (and SGLang frees A's metadata index) although A's transfer is unacknowledged and still in flight:
    kvshield itself keeps A's pages quarantined for exactly that reason. B of the same tenant on the same room is
    admitted. A's prefill then finishes: its metadata, kvshield's row included (room R, A's full coverage, tenant t1),
    lands at the reused index, and its Success names room R, which is all Mooncake's decode side keys status by. B's
    commit reads A's row (room matches, tenant matches, coverage covers B), ``record_covered`` marks every B page
    written and B is COMMITTED and decodes with HTTP 200 over pages no transfer wrote (here the planted -9.0; under
    ``NONE`` whatever the previous holder left, under ``ZERO`` zeros): the incident's shape (a decode request reads
    reserved-but-never-received pages, 200). The tenant-tag check only stops it when A and B are different tenants.
    Severity: high (wrong/residue KV served with 200; the page-by-page verification is bypassed for metadata transports).
    Cause: disagg.py:_forget (room released at give-up, not at acknowledgement) with transport.py:MetadataTransport.row
    (a row is accepted by room and tenant only; nothing binds it to the reservation/receiver that cleared it)."""
    passes(decode_results, "room_reused_while_aborted_transfer_in_flight")


def test_no_transfer_request_is_committed_from_another_tenants_metadata_row(decode_results):
    """Promise (README "Prefill→decode handoffs": no-transfer requests "get SGLang's fake receiver and no KV. They are
    admitted without a reservation or commit and decode over their own freshly allocated pages, zeroed"; a decode
    request reads only what its own transfer landed, never residue; the incident: responses carrying other
    customers' data with HTTP 200).
    What happens: kvshield admits a no-transfer request (any client may name SGLang's fake bootstrap host) and
    protects its KV pages, but SGLang's decode still commits its "transfer" from the metadata buffers at the request's
    (reused) metadata index: ``_commit_transfer_to_req`` appends ``output_id`` of that row (room check skipped for
    fake transfers) and takes ``cached_tokens``, logprobs/top-logprobs and speculative hidden states from it. Nothing
    cleared that row: kvshield's ``send_metadata`` clearing (``MetadataTransport.bind``) covers only its own coverage
    row and is never bound for no-transfer requests. So tenant t1's request starts decoding from tenant t2's first
    output token (sampled from t2's prompt) and returns it with HTTP 200 (with ``return_logprob``, t2's top-k
    logprobs too).
    Severity: medium-high (cross-tenant leak of per-request output state through an admitted path; one token and its
    logprob distribution per request, repeatable by any client).
    Cause: disagg.py:_admit (no-transfer branch: ``admit_no_transfer`` without clearing SGLang's metadata row at the
    request's index) / handoff.py:Handoff.admit_no_transfer."""
    passes(decode_results, "no_transfer_reads_previous_tenants_metadata_row")


def test_send_released_by_sglang_then_never_concluding_is_never_expired_nor_alarmed(results):
    """Promise (README "Prefill sends": "a sender that has not concluded KVSHIELD_PREFILL_SEND_TIMEOUT_S (default 60)
    seconds after the last chunk is expired: claims fenced, alarm (``PrefillSends.alarms()``)"; DESIGN: a timeout is
    never a free, but it is always an alarm).
    What happens: ``disagg_prefill.sweep`` expires only sends whose request is still in SGLang's inflight queue
    (``id(send.req) in queued``). A request SGLang released early (aborted after its last chunk: grammar rejection,
    client abort, the very path the claims exist for) whose transport then hangs is never expired: no fence, no alarm,
    its claims and pages held silently for the process lifetime (the send stays ``active``). The pages stay safe,
    but the promised alarm, the operator's only signal that a transport is stuck reading, never fires, and the
    capacity loss is unexplained.
    Severity: low-medium (silent leak/monitoring gap; no data exposure).
    Cause: disagg_prefill.py:sweep (``elif past and id(send.req) in queued``)."""
    passes(results, "released_send_never_concludes")


def test_twin_released_send_expired_only_while_queued_raises_no_alarm(results):
    fails(results, "released_send_never_concludes/expires_queued_only", "no alarm")


def test_twin_chunked_abort_sweeping_only_queued_sends_leaks_the_send(results):
    fails(results, "chunked_abort_after_a_sent_chunk/tracks_queued_only", "A's send is still active")


def test_chunked_send_overdue_while_sglang_still_prefills_is_expired_and_its_later_chunks_dropped(results):
    """The deadline of a send that never reached its last chunk runs from its last chunk handed to the transport:
    past it the send is expired (alarm, claims fenced) even though SGLang still chunk-prefills the request, which is
    failed (500); nothing more reaches the transport; the claims drop once the sender concludes."""
    passes(results, "overdue_mid_chunked_prefill")


def test_commit_refused_on_another_transfers_success_releases_pages_its_own_transfer_then_writes(decode_results):
    """Promise (README "Prefill→decode handoffs": "acknowledge drops claims on the transport's evidence only"; claims
    fence in-flight transfers so a late write lands only in quarantine; a failed transfer over these transports "is
    never acknowledged (prefill may still be writing)"; every failure fails closed).
    What happens: ``transport.MetadataTransport.row`` sets ``state.landed = True`` before it validates the row, and
    ``MetadataTransport.acknowledged`` is just ``landed``. With the room freed early, A's (tenant t1) late
    Success for room R reaches B (tenant t2, same room, its own prefill elsewhere, still to send). B's commit is
    rightly refused (tenant mismatch), but the refusal counts as the transport's acknowledgement: ``sweep`` drops B's
    writer claims, B's pages are scrubbed and handed to C (tenant t3), and B's real transfer then writes tenant t2's
    prompt KV into C's pages (a raw RDMA write no claim can stop once dropped). Any refusal after a Success that was
    not this transfer's (stale/foreign row, room mismatch) releases pages under a live writer.
    Severity: high (cross-tenant KV written into another tenant's live pages).
    Cause: transport.py:MetadataTransport.row (``state.landed = True`` before/regardless of the row's validity) and
    MetadataTransport.acknowledged; made reachable by disagg.py:_forget (room freed while a transfer is in flight)."""
    passes(decode_results, "refused_on_a_foreign_success_releases_pages_its_own_transfer_still_writes")


def test_a_room_reused_past_the_room_table_never_takes_the_unacknowledged_transfers_metadata_row(decode_results):
    """The row half of the fix against a room freed early, with the room table's fence planted away: A's metadata
    index stays A's until A's transfer is acknowledged or expired, so B waits for an index (one row) or gets another
    (two rows), where A's late completion never lands, and a foreign ``Success`` commits nothing (B waits for its own
    metadata)."""
    passes(decode_results, "room_reused_past_the_room_table")
    passes(decode_results, "room_reused_past_the_room_table_two_rows")


DECODE_TWINS = [
    # the room freed at give-up and the row accepted by room and tenant alone
    ("room_reused_twin_room_and_row_unbound", "decoded with HTTP 200"),
    # reading a row, refused or not, acknowledges the transfer
    ("refused_on_a_foreign_success_twin_refused_row_acknowledges", "B's pages handed out"),
    # a no-transfer request's metadata row is not cleared
    ("no_transfer_twin_row_kept", "from tenant t2's first output token"),
]


@pytest.mark.parametrize("name,why", DECODE_TWINS, ids=[n for n, _ in DECODE_TWINS])
def test_twins_planting_a_decode_defect_back_fail(decode_results, name, why):
    """Planted bugs (test code only, :func:`_planted`): each of the three decode defects put back must fail its
    scenario's oracle."""
    fails(decode_results, name, why)
