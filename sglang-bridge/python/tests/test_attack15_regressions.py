"""Attack round 15: the newest code (PD rebootstrap recompute channel, envelope rebinding, session checks, the bridge's
audit-trail wiring), driven through the real SGLang classes where SGLang is involved.

Each test failed on the code it was written against because of the finding its docstring names (promise, what
happens, severity, cause); each twin plants the defect back and must fail. Finding 1 (the recompute envelope's
tenant readable on the decode->prefill link) was decided as documented: the envelope is authenticated, not
encrypted, as are the prompt and output tokens the same POST carries (README, ``RecomputeChannel``)."""

import json

import pytest

import scenarios
from conftest import TEST_CLASSES, require_module
from fakes import MHAPool
from test_audit_bridge import _compliance, _records, _Req

torch = require_module("torch")


# ------------------------------------------------------------------------------------------------ 2. summaries

@pytest.mark.parametrize("twin", [False, True])
def test_a_requests_summary_is_recorded_before_its_deferred_release_reaches_the_pool(jvm, tmp_path, monkeypatch, twin):
    """Promise (SlotAllocator.requestFinished / AuditTrail.requestFinished: "call once, after the request's last release
    ... after its last page event"; bridge README: "each finished request's summary"; allocator.request_finished: "ended
    after its last release").
    What happens: plugin.release_kv_cache calls ``alloc.request_finished`` right after the ``releasing`` context, and
    request_finished crosses to Java at once (``self._call``), not through ``_run_or_defer``. On a GPU every free of a
    request's device slots (and its end and leftovers) is deferred to ``resolve_frees`` (the next step boundary), so
    the signed trail records the request's summary while the request still holds all its pages, and its free/release
    records come after its summary (a request that "completed" and then released pages), and whatever its release finds is
    missing from its summary: here its refused stale free is in the trail, yet its summary says ``rejections: 0``
    (a failed zero-verification at release would be missed the same way). Shown here with SGLang-shaped device index tensors
    (tests.fakes.DeviceOnlyTensor), the exact sequence the hook runs.
    Severity: medium (the audit record of a request is wrong about its own life; COMPLIANCE relies on it).
    Cause: allocator.py:_KvShieldMixin.request_finished (immediate crossing) called from
    plugin.py:_install_release.release_kv_cache."""
    from fakes import DeviceOnlyTensor, install_fake_cuda
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    def served(device, name):
        """One request through the bridge's release as the hook runs it (a stale second free of its first page
        refused); returns its pool id."""
        a = PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                        kvshield_settings=dict(level="COMPLIANCE", advertisedContextTokens=16))
        req = _Req(name)
        a.set_plan([(req, "acme", 0, 8)])
        slots = a.alloc(8)
        a.clear_plan()
        with a.releasing("acme", req, leftovers=True):  # plugin.release_kv_cache: SGLang's release inside
            a.free(device(slots))
            a.free(device(slots[:4]))
        a.request_finished(req, "acme", False, req.rid)  # what the hook does next
        rid = a.request_id(req)
        a.end_step()
        a.close()
        return rid

    # control: host index tensors (nothing deferred): the summary counts the refused free
    _compliance(tmp_path, monkeypatch)
    monkeypatch.setenv("KVSHIELD_AUDIT_DIR", str(tmp_path / "control"))
    served(lambda t: t, "rid-1")
    control = [r for r in _records(tmp_path / "control") if r["type"] == "summary"]
    assert [r["rejections"] for r in control] == [1], control

    install_fake_cuda(monkeypatch)
    trail, _ = _compliance(tmp_path, monkeypatch)
    if twin:  # planted bug: the end is recorded at once, ahead of the release's deferred operations
        monkeypatch.setattr(PagedTokenToKVPoolAllocator, "request_finished", lambda self, req, tenant, aborted, label:
                            self._call(self._j.requestFinished, self.tenant_id(tenant), self._known_request_id(req),
                                       aborted, label))
    rid = served(lambda t: DeviceOnlyTensor(t.tolist()), "gpu-rid-1")  # its row's device slots, as on a GPU
    records = _records(trail)
    summary_at = [i for i, r in enumerate(records) if r["type"] == "summary" and r.get("req") == rid]
    release_at = [i for i, r in enumerate(records) if r["type"] in ("release", "free") and r.get("req") == rid]
    assert summary_at and release_at, (summary_at, release_at, records)
    summary = records[summary_at[0]]
    refused = [r for r in records if r["type"].startswith("reject") and r.get("req") == rid]
    assert refused, records
    if twin:
        assert summary["rejections"] == 0 and summary_at[0] < max(release_at), (summary, summary_at, release_at)
        return
    assert summary["rejections"] == len(refused), (
        f"request {rid}'s summary says rejections={summary['rejections']}, the trail holds {len(refused)} refused"
        f" free(s) of it, recorded after its summary")
    assert summary_at[0] > max(release_at), (
        f"request {rid} was summarised before its release: its summary is record {summary_at[0]}, its release records"
        f" {release_at} come after it")


_PLANT_ENDS = r'''
import os
from kvshield_sglang import allocator as _allocator
if os.environ.get("PLANTED") == "ends-at-release":  # planted bug: an end decided at the release, a session's outside any
    def _at_release(self, req, tenant, outcome):      # request's release only (as before the fix)
        ended = outcome(req)
        if ended is not None:
            self.request_finished(req, tenant, ended, req.rid)
    _allocator._KvShieldMixin.request_released = _at_release
    _inner = _allocator._KvShieldMixin.request_finished
    def _outside_only(self, req, tenant, aborted, label):
        if not (isinstance(label, str) and label.startswith("session:") and self._releasing_request >= 0):
            _inner(self, req, tenant, aborted, label)
    _allocator._KvShieldMixin.request_finished = _outside_only
'''


_SESSIONS_AUDITED = _PLANT_ENDS + r'''
import json
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
with servers.single_rank():
    w = session_world.World("unified", 4)
    a = w.alloc
    w.open("s-closed", "acme")                  # control: a turn, then the session's close
    w.turn("s-closed", range(1, 8))
    w.close("s-closed")
    w.open("s-aborted", "globex")               # a turn, a mid-turn abort (release_session inside the release), close
    w.turn("s-aborted", range(500, 503))
    w.turn("s-aborted", [590, 591], abort=True)
    w.close("s-aborted")
    w.open("s-deferred", "acme")                # a turn, then a close while the next turn runs (deferred to its end)
    w.turn("s-deferred", range(20, 25))
    held = {n: a.request_id(w.sessions[n].session) for n in ("s-closed", "s-aborted", "s-deferred")}
    w.live_turn_refuses_others("s-deferred")
    w.plain("acme")
    a.end_step()
    held.update(acme=a.tenant_id("acme"), globex=a.tenant_id("globex"))
    print("IDS " + json.dumps(held), flush=True)
'''


@pytest.mark.parametrize("planted", ["", "ends-at-release"])
def test_a_streaming_session_ended_by_a_mid_turn_abort_or_a_deferred_close_is_never_summarised(jvm, tmp_path,
                                                                                                monkeypatch, planted):
    """Promise (bridge README: "each finished request's summary ... a streaming session's carries session:<id>";
    AuditTrail: one summary per finished request, so `audit request` shows how each holder ended).
    What happens: plugin.release_session writes the session's summary only on its outside-any-request path. A session's
    KV released from inside its turn's release (``alloc._releasing_request >= 0``) skips it: SGLang's mid-turn abort
    (``try_cache_finished_req`` -> ``release_session``) and kvshield's own deferred close (a close while a turn runs,
    run from ``try_cache_finished_req`` at the turn's end). The turn's own release skips summaries for streaming
    turns ("at its release"), and the later close finds no slot (``kvshield_session`` gone), so no summary is ever
    written for that session holder, though all its pages were allocated, read and released under it. Driven on
    SGLang's UnifiedRadixCache/StreamingSession (tests/session_world.py); the control session (turn, close) gets one.
    Severity: low-medium (audit completeness: under COMPLIANCE two ordinary session endings leave no summary).
    Cause: plugin.py:_install_streaming_sessions.release_session (the ``_releasing_request >= 0`` branch) with
    plugin.py:_install_release.release_kv_cache (``not _streaming(req)``)."""
    trail, _ = _compliance(tmp_path, monkeypatch)
    ids = scenarios.run_reporting(_SESSIONS_AUDITED, "IDS ", tmp_path, TEST_CLASSES, KVSHIELD_LEVEL="COMPLIANCE",
                                  KVSHIELD_ALLOW_UNFIXED_HANDOFF="1", PLANTED=planted)
    records = _records(trail)
    summarised = {r["req"] for r in records if r["type"] == "summary"}
    used = {r.get("req") for r in records if r["type"] != "summary"}
    assert ids["s-closed"] in summarised, ("control: a closed session is summarised", ids, sorted(summarised))
    missing = {n: ids[n] for n in ("s-aborted", "s-deferred") if ids[n] not in summarised}
    if planted:
        assert missing == {n: ids[n] for n in ("s-aborted", "s-deferred")}, (missing, ids)
        return
    assert not missing, (f"sessions {missing} held and released pages (their pool ids appear in"
                         f" {sorted(set(missing.values()) & used)} of the trail's records) but have no summary;"
                         f" summaries: {sorted(summarised)}")


_PREFILL_AUDITED = _PLANT_ENDS + r'''
import json, os
from kvshield_sglang import plugin
import prefill_world
from prefill_world import KVPoll, disagg_prefill
plugin.load()
import servers
servers.one_process_group()
with servers.single_rank():
    servers.publish_server_args(attention_backend="torch_native")
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = prefill_world.Scheduler()
    ok = s.request("prefill-ok", 12)                  # control: its transfer succeeds
    s.prefill(ok, 100.0)
    ok.disagg_kv_sender.state = KVPoll.Success
    s.process_disagg_prefill_inflight_queue()
    s.step()
    bad = s.request("prefill-transfer-failed", 12, tenant="t2")   # its transfer fails (the decode side went away)
    s.prefill(bad, 200.0)
    bad.disagg_kv_sender.state = KVPoll.Failed
    s.process_disagg_prefill_inflight_queue()
    s.step()
    out = {"ok": s.alloc.request_id(ok), "bad": s.alloc.request_id(bad), "bad_finished": bad.finished(),
           "bad_reason": type(bad.finished_reason).__name__, "available": s.alloc.available_size(),
           "size": prefill_world.SIZE}
    print("IDS " + json.dumps(out), flush=True)
'''


@pytest.mark.parametrize("planted", ["", "ends-at-release"])
def test_a_prefill_request_whose_kv_transfer_failed_is_never_summarised(jvm, tmp_path, monkeypatch, planted):
    """Promise (bridge README: "each finished request's summary (written at the next step boundary) carries its rid";
    AuditTrail.requestFinished: one summary per request, with its outcome; round 14's fix: "each finished request ...
    summarised through SGLang's release").
    What happens: the hook in ``release_kv_cache`` summarises only a request that is ``finished()`` when released.
    SGLang's PD prefill releases a request whose KV transfer failed (``process_disagg_prefill_inflight_queue`` ->
    transfer-failure handling) and only then ``prepare_abort``s it; its bootstrap failure
    (``handle_bootstrap_failure``) does the same, and a decode server's abort of a queued request releases its
    preallocated KV without finishing it. The request is aborted to its client and never released again, so the signed
    trail shows its pages allocated and released and no summary at all: the failed transfers, the very requests an
    operator audits, are the ones missing. Driven through SGLang's own prefill mixin (tests/prefill_world.py); the
    successful transfer beside it is summarised.
    Severity: low-medium (audit completeness; every failed PD transfer lacks its summary).
    Cause: plugin.py:_install_release.release_kv_cache (``req.finished()`` checked at release time; SGLang finishes
    these requests after their last release)."""
    trail, _ = _compliance(tmp_path, monkeypatch)
    ids = scenarios.run_reporting(_PREFILL_AUDITED, "IDS ", tmp_path, TEST_CLASSES, PLANTED=planted)
    records = _records(trail)
    summarised = {r["req"] for r in records if r["type"] == "summary"}
    used = {r.get("req") for r in records if r["type"] != "summary"}
    assert ids["ok"] in summarised, ("control: the successful transfer is summarised", ids, sorted(summarised))
    assert ids["bad_finished"] and ids["bad"] in used, ids
    if planted:
        assert ids["bad"] not in summarised, (ids, sorted(summarised))
        return
    assert ids["bad"] in summarised, (
        f"request {ids['bad']} (rid prefill-transfer-failed, {ids['bad_reason']}) held and released pages but has no"
        f" summary; summaries: {sorted(summarised)}")


@pytest.mark.parametrize("planted", ["", "unbound-fields"])
def test_a_captured_recompute_envelope_runs_another_request_than_the_recompute_as_its_tenant(jvm, tmp_path, planted):
    """Promise (design note 41: an envelope "bound to the request id and its token ids"; "one captured off the wire
    between the servers replays only that request's tokens as its tenant, the recompute the decode server asked
    for"; RecomputeChannel.binding: "selects its tenant for no other content").
    What happens: the binding covers ``rid`` and ``input_ids`` only. The decode server's recompute is a one-token
    prefill (``build_rebootstrap_payload`` forces ``max_new_tokens=1``, no logprobs, no stream); the prefill server
    accepts the same envelope on a body that asks for anything else (hundreds of new tokens, logprobs, streaming; the
    same holds for ``session_params``, ``lora_path``, ``image_data``, ``n``, none of them bound) and runs it as the
    envelope's tenant: whoever holds one POST body off the (plain HTTP, past the gateway) decode->prefill path gets
    generations billed to, quota-counted as, and cached in the namespace of the victim tenant, not the replay of the
    recompute the note accepts. Driven through the prefill server's own TokenizerManager.generate_request and
    Scheduler.handle_generate_request (test_rebootstrap's world).
    Severity: medium (given one captured body: another tenant's identity for arbitrary generation on those tokens).
    Cause: tenants.py:RecomputeChannel.binding (binds rid and token ids only), engine_hooks.py:recomputed_tenant."""
    import os

    import test_rebootstrap

    script = test_rebootstrap.SCRIPT.replace(
        'OUT["recomputed"] = [[resolver.resolve_request(p), p.extra_key, list(p.origin_input_ids)] for p in s.waiting_queue]',
        'OUT["recomputed"] = [[resolver.resolve_request(p), p.sampling_params.max_new_tokens, p.return_logprob]'
        ' for p in s.waiting_queue]')
    assert script != test_rebootstrap.SCRIPT
    env = {"KVSHIELD_TENANT_HEADER": "x-tenant", "KVSHIELD_RECOMPUTE_KEY": test_rebootstrap._key(tmp_path),
           "TAMPER": json.dumps({"sampling_params": {"max_new_tokens": 48}, "return_logprob": True}), "PLANTED": planted}
    out = scenarios.run_reporting(script, "REBOOTSTRAP ", tmp_path, TEST_CLASSES, **env)
    assert out["posted"] == 1, out
    if planted:
        assert out["recomputed"] == [["acme", 48, True]], out
        return
    assert "refused" in out and not out["recomputed"], (
        f"a body the decode server never sent (48 new tokens with logprobs instead of the one-token recompute) ran"
        f" on its envelope as [tenant, max_new_tokens, return_logprob] = {out['recomputed']}")


_SESSION_NAMES = r'''
import json, os, types
from array import array
from kvshield_sglang import engine_hooks, plugin
if os.environ.get("PLANTED") == "owner-named":  # planted bug: the client's abort message names the session's tenant
    _refuse = plugin._refuse_turn
    plugin._refuse_turn = lambda req, session, why, clear_inflight, owner=None: _refuse(
        req, session, why.replace("another tenant", f"tenant {owner}"), clear_inflight)
plugin.load()
import servers
servers.publish_server_args()
with servers.single_rank():
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.managers.scheduler import Scheduler
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.session.session_controller import SessionController
    tree = types.SimpleNamespace(release_radix_session=lambda sid: None, open_radix_session=lambda sid: None,
                                 release_session=lambda sid: None)
    sched = types.SimpleNamespace(enable_session_radix_cache=True, disable_radix_cache=True, tree_cache=tree,
                                  session_controller=SessionController(tree),
                                  ps=types.SimpleNamespace(pp_rank=0, tp_rank=0, attn_cp_rank=0))
    def request(rid, tenant, sid):
        with engine_hooks.building(tenant):
            req = Req(rid, "", array("q", [7, 8]), SamplingParams(max_new_tokens=1), session_id=sid)
        Scheduler._maybe_namespace_elastic_radix_cache(sched, req)
        return req
    request("acme-1", "acme-secret-customer", "chat-42")          # acme's radix-native session id, first use
    probe = request("globex-1", "globex", "chat-42")               # another tenant's client names the same id
    reason = probe.to_finish
    print("NAMES " + json.dumps({"refused": reason is not None,
                                "client_sees": reason.to_json() if reason is not None else None}), flush=True)
'''


@pytest.mark.parametrize("planted", ["", "owner-named"])
def test_a_refused_session_request_tells_the_other_tenants_client_the_owners_tenant_name(jvm, tmp_path, planted):
    """Promise (README: "one tenant's ... identity can never reach another's"; tenants.py: a tenant comes only from a
    source the gateway controls; the channel key "never appears in logs, exceptions"; design note 38: another tenant's
    request naming a session is refused "before it reads anything").
    What happens: the refusal's reason is SGLang's abort message, and SGLang returns that message to the client in the
    response's ``meta_info.finish_reason`` (``FINISH_ABORT.to_json``). kvshield writes the owner's tenant name into it:
    "tenant globex names radix session chat-42 of tenant acme-secret-customer" (radix-native, plugin
    ``radix_session_checked``; the same text for ``Session.create_req`` and a streaming turn's match). So any client
    can probe session ids and learn, per id, which other tenant owns it, and that tenant's name. Driven through
    SGLang's ``Req`` and ``Scheduler._maybe_namespace_elastic_radix_cache`` as in test_session_scenarios.
    Severity: medium (cross-tenant identity disclosure, and an oracle over other tenants' session ids).
    Cause: plugin.py:_install_session_control.radix_session_checked / create_req and
    _install_streaming_sessions.try_match_prefix (the ``why`` passed to _refuse_turn -> _abort_unprefilled ->
    Req.set_finish_with_abort)."""
    out = scenarios.run_reporting(_SESSION_NAMES, "NAMES ", tmp_path, TEST_CLASSES, KVSHIELD_TENANT_HEADER="x-tenant",
                                  PLANTED=planted)
    assert out["refused"], out
    if planted:
        assert "acme-secret-customer" in json.dumps(out["client_sees"]), out
        return
    assert "acme-secret-customer" not in json.dumps(out["client_sees"]), (
        f"globex's client is answered {out['client_sees']}: the owning tenant's name")


@pytest.mark.parametrize("planted", ["", "unbound-fields"])
def test_a_captured_recompute_envelope_reads_the_tenants_session_history_into_another_request(jvm, tmp_path, planted):
    """Promise (design note 41: a captured envelope "replays only that request's tokens as its tenant, the recompute
    the decode server asked for"; RecomputeChannel.binding: "selects its tenant for no other content"; README: an
    opened session refuses another tenant's request of any kind).
    What happens: the binding leaves ``session_params`` out, so a captured recompute body re-sent with
    ``session_params={"id": <acme's session>, "rid": <an acme turn>}`` runs as acme, passes the session's tenant check
    (it IS acme now) and SGLang's ``Session.create_req`` builds it on that turn's prompt and output: the request the
    holder of the captured body submits has acme's private conversation (tokens 501..505 and its output 601, 602) as
    its input, and its generation is returned to that holder. Driven through the prefill server's own
    TokenizerManager.generate_request, Scheduler.handle_generate_request and SGLang's SessionController.
    Severity: medium-high given one captured decode->prefill body and a session id: another tenant's session content.
    Cause: tenants.py:RecomputeChannel.binding (binds rid and token ids only), engine_hooks.py:recomputed_tenant."""
    import test_rebootstrap

    victim = r'''
    from sglang.srt.managers.io_struct import OpenSessionReqInput
    from sglang.srt.managers.schedule_batch import FINISH_LENGTH
    from sglang.srt.session.session_controller import SessionController
    s.session_controller = SessionController(types.SimpleNamespace(release_radix_session=lambda sid: None,
                                                                   release_session=lambda sid: None))
    s.session_controller.open(OpenSessionReqInput(capacity_of_str_len=1 << 10, session_id="acme-chat"))
    servers.send(tm, GenerateReqInput(rid="acme-turn-1", input_ids=[501, 502, 503, 504, 505],
                                      session_params={"id": "acme-chat"}, sampling_params={"max_new_tokens": 2}),
                 Request({"x-tenant": "acme"}))
    for t in tm.sent:
        s.handle_generate_request(pickle.loads(pickle.dumps(t)))
    tm.sent.clear()
    turn = s.waiting_queue.pop()
    turn.output_ids.extend([601, 602])
    turn.finished_reason, turn.finished_len = FINISH_LENGTH(length=2), 2
    for body in posted:
'''
    script = test_rebootstrap.SCRIPT.replace("\n    for body in posted:\n", "\n" + victim.strip("\n").replace(
        "\n    ", "\n    ") + "\n", 1)
    script = script.replace(
        'OUT["recomputed"] = [[resolver.resolve_request(p), p.extra_key, list(p.origin_input_ids)] for p in s.waiting_queue]',
        'OUT["recomputed"] = [[p.rid, resolver.resolve_request(p), list(p.origin_input_ids)] for p in s.waiting_queue]')
    assert script.count("acme-turn-1") == 1 and "p.rid, resolver" in script
    env = {"KVSHIELD_TENANT_HEADER": "x-tenant", "KVSHIELD_RECOMPUTE_KEY": test_rebootstrap._key(tmp_path),
           "TAMPER": json.dumps({"session_params": {"id": "acme-chat", "rid": "acme-turn-1"}}), "PLANTED": planted}
    out = scenarios.run_reporting(script, "REBOOTSTRAP ", tmp_path, TEST_CLASSES, **env)
    assert out["posted"] == 1, out
    leaked = [r for r in out["recomputed"] if 501 in r[2] or 601 in r[2]]
    if planted:
        assert leaked, out
        return
    assert not leaked, (f"the re-sent recompute body ran as [rid, tenant, input] = {leaked}: acme's session turn"
                        " (501..505, output 601 602) is its input")
