"""PD true-retraction rebootstrap with tenants: a decode server re-sends a retracted request to its prefill server's
``/generate`` (``Req.build_rebootstrap_payload`` -> ``CommonKVManager.submit_prefill_recompute``), a POST past the
gateway with no tenant header. With the deployment's recompute key (``KVSHIELD_RECOMPUTE_KEY``) the payload carries
the request's tenant sealed in its ``extra_key`` and the prefill server recomputes it as that tenant, in that
tenant's tree namespace; without the key it is refused (the request fails), never recomputed as the default tenant.
Each scenario runs the real SGLang's decode-side calls, then the prefill server's own entry point
(``TokenizerManager.generate_request``) and scheduler handler on what was POSTed, in a subprocess (the plug-in
replaces SGLang's classes process-wide); each twin plants a defect and must fail."""

import json
import os

import pytest
import scenarios
from conftest import TEST_CLASSES

_MARK = "REBOOTSTRAP "

SCRIPT = r"""
import json, os, pickle, types
from array import array
from kvshield_sglang import engine_hooks, plugin
from kvshield_sglang.tenants import RecomputeChannel, TenantResolver
planted = os.environ.get("PLANTED")
if planted == "trusting-envelope":    # the prefill server believes a recompute envelope without its MAC
    def _trusting_open(self, obj):
        import base64
        payload = obj.extra_key[len(self.PREFIX):].rpartition(".")[0]
        return tuple(json.loads(base64.urlsafe_b64decode(payload))[:2])
    RecomputeChannel.open_request = _trusting_open
if planted == "unbound-fields":       # the envelope's MAC is checked, not which request it was sealed for
    RecomputeChannel.open_request = lambda self, obj: (lambda o: o and (o[0], o[1]))(self._verified(obj.extra_key))
plugin.load()
import servers
from sglang.srt.disaggregation.common.conn import CommonKVManager
from sglang.srt.managers.io_struct import GenerateReqInput
if planted == "tagged-payload":       # the payload copies the tenant's tree namespace (its name on the wire)
    from sglang.srt.managers.schedule_batch import Req
    Req.build_rebootstrap_payload = Req.build_rebootstrap_payload.__wrapped__
if planted == "no-refusal":           # the recompute is POSTed without a recompute key while tenants are configured
    CommonKVManager.submit_prefill_recompute = CommonKVManager.submit_prefill_recompute.__wrapped__
if planted == "envelope-ignored":     # the prefill server runs the POST as its headers' (the default) tenant
    engine_hooks.recomputed_tenant = lambda obj, resolved, recompute, resolver: resolved
OUT = {}
with servers.single_rank():
    r = servers.request("acme-r", list(range(10, 22)), os.environ.get("TENANT", "acme"), extra_key="x")
    r.output_ids = array("q", [99])
    payload = r.build_rebootstrap_payload()        # what the decode server POSTs to the prefill server's /generate
    OUT["payload_extra_key"] = payload["extra_key"]
    failed, posted = [], []
    class Receiver:
        bootstrap_room, bootstrap_addr = 7, "prefill:8998"
        def abort(self):
            failed.append("abort")
    mgr = types.SimpleNamespace(attn_tp_rank=0, attn_cp_rank=0, pp_rank=0,
                                record_failure=lambda room, reason: failed.append(reason),
                                _resolve_rebootstrap_prefill_url=lambda receiver: "http://prefill:30000",
                                _run_prefill_recompute=None,  # the POST itself: the executor records its body
                                _ensure_prefill_recompute_executor=lambda: types.SimpleNamespace(
                                    submit=lambda fn, receiver, url, body: posted.append(body)))
    CommonKVManager.submit_prefill_recompute(mgr, Receiver(), payload)
    OUT["failed"], OUT["posted"] = failed, len(posted)

    class Request:  # FastAPI's request on the prefill server: the POST's headers
        def __init__(self, headers):
            self.headers = headers
    servers.publish_server_args(disaggregation_mode="prefill")  # the prefill server's configuration
    tm, s = servers.tokenizer_manager(), servers.scheduler()
    for body in posted:
        body = dict(body, **json.loads(os.environ.get("TAMPER", "{}")))
        if os.environ.get("FORGE"):  # an envelope of the right shape under another key
            binding = RecomputeChannel.binding({k: v for k, v in body.items() if k != "extra_key"})
            body["extra_key"] = RecomputeChannel(b"f" * 32).seal(binding, os.environ["FORGE"], "x")
        try:
            servers.send(tm, GenerateReqInput(**body), Request(json.loads(os.environ.get("HEADERS", "{}"))))
        except ValueError as e:
            OUT["refused"] = str(e)
    for t in tm.sent:  # the process boundary to the prefill server's scheduler
        s.handle_generate_request(pickle.loads(pickle.dumps(t)))
    resolver = TenantResolver.from_env()
    OUT["recomputed"] = [[resolver.resolve_request(p), p.extra_key, list(p.origin_input_ids)] for p in s.waiting_queue]
    OUT["request_namespace"] = r.extra_key
    OUT["sequence"] = list(r.origin_input_ids) + list(r.output_ids)
print("REBOOTSTRAP " + json.dumps(OUT))
"""


def _key(tmp_path, data=b"k" * 32, mode=0o600):
    path = tmp_path / "recompute.key"
    path.write_bytes(data)
    os.chmod(path, mode)
    return str(path)


def _run(tmp_path, tenants=True, key=True, **env):
    if tenants:
        env["KVSHIELD_TENANT_HEADER"] = "x-tenant"
    if key:
        env["KVSHIELD_RECOMPUTE_KEY"] = _key(tmp_path)
    return scenarios.run_reporting(SCRIPT, _MARK, tmp_path, TEST_CLASSES, **env)


def test_a_rebootstrap_is_recomputed_as_its_tenant_in_its_tenants_namespace(jvm, tmp_path):
    out = _run(tmp_path)
    assert out["posted"] == 1 and not out["failed"], out
    sealed = out["payload_extra_key"]
    assert sealed.startswith("kvshield-recompute/1:") and "acme" not in sealed, f"on the wire: {sealed!r}"
    assert out["recomputed"] == [["acme", out["request_namespace"], out["sequence"]]], (
        f"the prefill server recomputed {out['recomputed']}, not acme's sequence in {out['request_namespace']!r}")


def test_without_a_recompute_key_a_tenants_rebootstrap_is_refused_not_recomputed_as_the_default_tenant(jvm, tmp_path):
    out = _run(tmp_path, key=False)
    assert out["payload_extra_key"] == "x", f"the rebootstrap payload carries {out['payload_extra_key']!r} on the wire"
    assert out["posted"] == 0 and out["failed"] and "KVSHIELD_RECOMPUTE_KEY" in out["failed"][-1], out
    assert out["recomputed"] == [], out


def test_without_tenants_a_rebootstrap_recomputes_as_before(jvm, tmp_path):
    out = _run(tmp_path, tenants=False, key=False, TENANT="default")
    assert out["posted"] == 1 and not out["failed"] and out["payload_extra_key"] == "x", out
    assert out["recomputed"] == [["default", out["request_namespace"], out["sequence"]]], out


@pytest.mark.parametrize("attack, env", [
    ("another request's envelope", {"TAMPER": '{"rid": "mallory-r"}'}),
    ("the envelope over other tokens", {"TAMPER": '{"input_ids": [10, 11, 12]}'}),
    ("another key's envelope", {"FORGE": "acme"}),
    ("an envelope against the gateway's tenant", {"HEADERS": '{"x-tenant": "globex"}'}),
])
def test_a_recompute_envelope_that_does_not_verify_is_refused(jvm, tmp_path, attack, env):
    out = _run(tmp_path, **env)
    assert out["recomputed"] == [] and "refused" in out, f"{attack}: the prefill server ran it: {out['recomputed']}"
    assert "request " in out["refused"] and "refused" in out["refused"], out["refused"]


@pytest.mark.parametrize("planted", ["tagged-payload", "no-refusal", "envelope-ignored", "trusting-envelope"])
def test_twin_a_rebootstrap_leaks_the_tenant_or_runs_as_another_tenant(jvm, tmp_path, planted):
    if planted == "tagged-payload":
        out = _run(tmp_path, PLANTED=planted)
        assert out["payload_extra_key"] == out["request_namespace"] and "acme" in out["payload_extra_key"], out
    elif planted == "no-refusal":
        out = _run(tmp_path, key=False, PLANTED=planted)
        assert out["posted"] == 1 and out["recomputed"][0][0] == "default", out
    elif planted == "envelope-ignored":
        out = _run(tmp_path, PLANTED=planted)
        assert out["recomputed"][0][0] == "default" and out["recomputed"][0][1] != out["request_namespace"], out
    else:
        out = _run(tmp_path, PLANTED=planted, FORGE="globex")
        assert out["recomputed"][0][0] == "globex", out


def test_the_prefill_server_opens_an_envelope_only_on_the_request_it_was_sealed_for(jvm):
    from kvshield_sglang.engine_hooks import recomputed_tenant
    from kvshield_sglang.tenants import RecomputeChannel, TenantResolver
    from sglang.srt.managers.io_struct import GenerateReqInput

    resolver, channel = TenantResolver(header="x-tenant"), RecomputeChannel(b"k" * 32)
    body = {"rid": "r1", "input_ids": [1, 2], "sampling_params": {"max_new_tokens": 1}, "return_logprob": False}
    sealed = channel.seal(RecomputeChannel.binding(body), "acme", "x")

    def request(**changes):
        return GenerateReqInput(**dict(body, extra_key=sealed, **changes))

    assert recomputed_tenant(request(), "default", channel, resolver) == "acme"
    refused = [(None, request()),  # no recompute key on this server
               (channel, GenerateReqInput(rid=["r1"], input_ids=[[1, 2]], extra_key=[sealed])),  # inside a batch
               (channel, request(sampling_params={"max_new_tokens": 48})),  # a bound field changed
               (channel, request(return_logprob=True)),
               (channel, request(session_params={"id": "acme-chat", "rid": "acme-turn-1"})),  # a field added
               (channel, request(lora_path="adapter"))]
    for recompute, obj in refused:
        with pytest.raises(ValueError, match="request .*r1.* cannot open: refused"):
            recomputed_tenant(obj, None, recompute, resolver)
        assert obj.extra_key in (sealed, [sealed]), "a refused request was changed"
    plain = GenerateReqInput(**dict(body, extra_key="x"))
    assert recomputed_tenant(plain, "globex", channel, resolver) == "globex" and plain.extra_key == "x"
    opened = request()
    assert recomputed_tenant(opened, "default", channel, resolver) == "acme" and opened.extra_key == "x"


def test_a_recompute_key_others_can_read_or_of_the_wrong_size_is_refused_naming_the_file(tmp_path):
    from kvshield_sglang.tenants import RecomputeChannel, TenantChannel

    for data, mode, why in ((b"k" * 32, 0o640, "owner-only"), (b"k" * 31, 0o600, "holds 31 bytes")):
        path = _key(tmp_path, data, mode)
        with pytest.raises(ValueError, match=f"KVSHIELD_RECOMPUTE_KEY {path} .*{why}"):
            RecomputeChannel.from_env({"KVSHIELD_RECOMPUTE_KEY": path})
    assert RecomputeChannel.from_env({}) is None
    channel = RecomputeChannel.from_env({"KVSHIELD_RECOMPUTE_KEY": _key(tmp_path)})
    assert "k" * 8 not in repr(channel) and "hidden" in repr(channel)
    # one key, two channels: neither opens the other's envelopes (distinct prefixes, both under the MAC)
    server = TenantChannel(b"k" * 32)
    forged = TenantChannel.PREFIX + channel.seal("r1", "acme", None)[len(RecomputeChannel.PREFIX):]
    assert server.open("r1", forged)[0] is False and channel.open("r1", channel.seal("r1", "acme", None))[0]


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
    Scheduler.handle_generate_request (this file's world).
    Severity: medium (given one captured body: another tenant's identity for arbitrary generation on those tokens).
    Cause: tenants.py:RecomputeChannel.binding (binds rid and token ids only), engine_hooks.py:recomputed_tenant."""
    script = SCRIPT.replace(
        'OUT["recomputed"] = [[resolver.resolve_request(p), p.extra_key, list(p.origin_input_ids)] for p in s.waiting_queue]',
        'OUT["recomputed"] = [[resolver.resolve_request(p), p.sampling_params.max_new_tokens, p.return_logprob]'
        ' for p in s.waiting_queue]')
    assert script != SCRIPT
    env = {"KVSHIELD_TENANT_HEADER": "x-tenant", "KVSHIELD_RECOMPUTE_KEY": _key(tmp_path),
           "TAMPER": json.dumps({"sampling_params": {"max_new_tokens": 48}, "return_logprob": True}), "PLANTED": planted}
    out = scenarios.run_reporting(script, "REBOOTSTRAP ", tmp_path, TEST_CLASSES, **env)
    assert out["posted"] == 1, out
    if planted:
        assert out["recomputed"] == [["acme", 48, True]], out
        return
    assert "refused" in out and not out["recomputed"], (
        f"a body the decode server never sent (48 new tokens with logprobs instead of the one-token recompute) ran"
        f" on its envelope as [tenant, max_new_tokens, return_logprob] = {out['recomputed']}")


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
    script = SCRIPT.replace("\n    for body in posted:\n", "\n" + victim.strip("\n").replace(
        "\n    ", "\n    ") + "\n", 1)
    script = script.replace(
        'OUT["recomputed"] = [[resolver.resolve_request(p), p.extra_key, list(p.origin_input_ids)] for p in s.waiting_queue]',
        'OUT["recomputed"] = [[p.rid, resolver.resolve_request(p), list(p.origin_input_ids)] for p in s.waiting_queue]')
    assert script.count("acme-turn-1") == 1 and "p.rid, resolver" in script
    env = {"KVSHIELD_TENANT_HEADER": "x-tenant", "KVSHIELD_RECOMPUTE_KEY": _key(tmp_path),
           "TAMPER": json.dumps({"session_params": {"id": "acme-chat", "rid": "acme-turn-1"}}), "PLANTED": planted}
    out = scenarios.run_reporting(script, "REBOOTSTRAP ", tmp_path, TEST_CLASSES, **env)
    assert out["posted"] == 1, out
    leaked = [r for r in out["recomputed"] if 501 in r[2] or 601 in r[2]]
    if planted:
        assert leaked, out
        return
    assert not leaked, (f"the re-sent recompute body ran as [rid, tenant, input] = {leaked}: acme's session turn"
                        " (501..505, output 601 602) is its input")
