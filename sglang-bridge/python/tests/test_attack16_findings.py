"""Attack round 16: the PD handoff (prefill sends, decode commits) driven through the real SGLang classes.

Each test FAILS on the code it was written against because of the finding its docstring names (promise, what
happens, severity, cause). The scenarios run in a subprocess on the real SGLang (``scenarios.run_world`` imports
this module there and calls :func:`main`), through ``prefill_world``/``disagg_world``, as the existing PD tests do.
"""

import os

import pytest

from conftest import TEST_CLASSES
from scenarios import passes, run_world


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


def chunked_abort_after_a_sent_chunk():
    """A (20 tokens, 8-token chunks) has its first chunk sent by SGLang's ``process_prefill_chunk`` (2 pages
    reader-claimed), then the client aborts it: SGLang's ``process_pending_chunked_abort`` aborts the sender
    (poll -> Failed), releases A's KV and drops A (it never reaches the inflight queue). The transport concluded,
    so A's claims must drop, its pages come back scrubbed and its room must be free again."""
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
    a.bootstrap_room = 5151
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
    if not sends.alarms():
        problems.append("no alarm was raised either")
    b = s.request("b", 4)
    b.bootstrap_room = 5151
    try:
        disagg.PREFILL_ROOMS.claim(b)
    except HandoffError as e:
        problems.append(f"a new request on A's room is refused: {e}")
    assert not problems, "; ".join(problems)
    del torch


SCENARIOS = {
    "chunked_abort_after_a_sent_chunk": (chunked_abort_after_a_sent_chunk, {}),
}


def main():
    import scenarios
    import servers
    from kvshield_sglang import plugin

    plugin.load()
    servers.one_process_group()
    with servers.single_rank():
        servers.publish_server_args(attention_backend="torch_native")
        scenarios.report(SCENARIOS)


# ------------------------------------------------------------------------------------------------ the tests

@pytest.fixture(scope="module")
def results(jvm, tmp_path_factory):
    return run_world("test_attack16_findings", tmp_path_factory.mktemp("ranks"), TEST_CLASSES)


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
