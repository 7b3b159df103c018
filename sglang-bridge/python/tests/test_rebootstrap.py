"""PD true-retraction rebootstrap with tenants: a decode server re-sends a retracted request to its prefill server's
``/generate`` (``Req.build_rebootstrap_payload`` -> ``CommonKVManager.submit_prefill_recompute``), a POST past the
gateway with no tenant header. With the deployment's recompute key (``KVSHIELD_RECOMPUTE_KEY``) the payload carries
the request's tenant sealed in its ``extra_key`` and the prefill server recomputes it as that tenant, in that
tenant's tree namespace; without the key it is refused (the request fails), never recomputed as the default tenant.
Each scenario runs the real SGLang's decode-side calls, then the prefill server's own entry point
(``TokenizerManager.generate_request``) and scheduler handler on what was POSTed, in a subprocess (the plug-in
replaces SGLang's classes process-wide); each twin plants a defect and must fail."""

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
