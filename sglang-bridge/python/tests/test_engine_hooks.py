"""The trusted tenant end to end: gateway header (or API key) in the HTTP/tokenizer process →
tokenized request (pickled across) → the scheduler's Req → page attribution, against the SGLang
stand-in (tests/stub_sglang) in a subprocess, for both shapes of SGLang's tokenized request (a
dataclass that takes an extra attribute; a msgspec Struct that does not, where the tenant travels
sealed in ``extra_key``); and the hooks' probes when a target is missing."""

import json
import logging

import pytest

from test_upstream_stub import _run

TENANT_RUN = r"""
import asyncio, os, pickle
import torch
from fakes import MHAPool, extend_batch
from kvshield_sglang import plugin, tenants
from kvshield_sglang.tenants import TenantChannel, TenantResolver
if os.environ.get("PLANTED") == "trusting-channel":  # planted bug: an envelope is believed without its MAC
    def _trusting_open(self, rid, value):
        import base64, json
        if not isinstance(value, str) or not value.startswith(self.PREFIX):
            return False, None, value
        tenant, original = json.loads(base64.urlsafe_b64decode(value[len(self.PREFIX):].rpartition(".")[0]))
        return True, tenant, original
    TenantChannel.open = _trusting_open
plugin.load()
from sglang.srt.managers.io_struct import GenerateReqInput, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.mem_cache import common
import sglang.srt.model_executor.model_runner as model_runner

class Request:  # FastAPI's request, as the HTTP entry points pass it: headers only matter here
    def __init__(self, headers):
        self.headers = headers

tm = TokenizerManager()
def send(obj, request):
    async def go():
        return [x async for x in tm.generate_request(obj, request)]
    return asyncio.run(go())

attacker = TenantChannel(b"k" * 32)  # a client's own key: envelopes of the right shape, not this server's
forged = attacker.seal("r2", "globex", None)
spoofed = GenerateReqInput(text="hello", rid="r1", custom={"kvshield_tenant": "globex"}, extra_key="ns-1")
spoofed.kvshield_tenant = "globex"  # even a body field of this name set server-side is overwritten
send(spoofed, Request({"X-Tenant": "acme", "x-kvshield-tenant": "globex"}))
send(GenerateReqInput(text="body only", rid="r2", custom={"kvshield_tenant": "acme"}, extra_key=forged), Request({}))
send(GenerateReqInput(text="key", rid="r3"), Request({"authorization": "Bearer key-7"}))
send(GenerateReqInput(text="engine api", rid="r4"), None)
wire = [pickle.loads(blob) for blob in tm.sent]
genuine = wire[0].extra_key  # what the tokenizer sealed for r1 (a client never sees it)
# An entry point that never sealed (e.g. gRPC) hands the scheduler the client's extra_key as is:
direct = [TokenizedGenerateReqInput(rid="r5", input_text="x", input_ids=[1], extra_key=attacker.seal("r5", "globex", None)),
          TokenizedGenerateReqInput(rid="r6", input_text="x", input_ids=[1], extra_key=genuine)]  # replayed for r6

scheduler = Scheduler()
for blob in tm.sent + [pickle.dumps(d) for d in direct]:  # the process boundary: only what pickles crosses
    scheduler.handle_generate_request(pickle.loads(blob))
reqs = scheduler.waiting_queue
resolver = TenantResolver.from_env()
print("tenants", [resolver.resolve_request(r) for r in reqs])
print("extra_keys", [r.extra_key for r in reqs[:4:2]], reqs[1].extra_key == forged, reqs[3].extra_key,
      reqs[4].extra_key == direct[0].extra_key, reqs[5].extra_key == genuine)
print("sealed on the wire", isinstance(genuine, str) and genuine.startswith(TenantChannel.PREFIX) and "acme" not in genuine)
print("outside", getattr(Req("x", "", []), "kvshield_tenant", "unset"))

a = model_runner.PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", MHAPool(32, 4), False)
out = common.alloc_for_extend(extend_batch(a, reqs[:2], [4, 4]))
print("owners", [a.page_owner(int(s) // 4)[0] for s in out[::4]])
"""


def _tenant_run(tmp_path, **env):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"key-7": "initech"}))
    r = _run(["-c", TENANT_RUN], tmp_path, KVSHIELD_TENANT_HEADER="X-Tenant", KVSHIELD_API_KEY_MAP=str(keys),
             KVSHIELD_ADVERTISED_CONTEXT_TOKENS="32", **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


@pytest.mark.parametrize("shape", ["dataclass", "msgspec"])
def test_gateway_tenant_travels_from_the_http_request_to_the_schedulers_pages(jvm, tmp_path, shape):
    r = _tenant_run(tmp_path, SGLANG_STUB_IO_STRUCT=shape)
    assert "tenants ['acme', 'default', 'initech', 'default', 'default', 'default']" in r.stdout, r.stdout
    # SGLang sees each request's own extra_key, whatever travelled in it
    assert "extra_keys ['ns-1', None] True None True" in r.stdout, r.stdout
    assert ("sealed on the wire True" in r.stdout) == (shape == "msgspec"), r.stdout
    assert "outside None" in r.stdout, r.stdout
    assert "owners ['acme', 'default']" in r.stdout, r.stdout
    if shape == "msgspec":
        for rid in ("r5", "r6"):  # r2's forged envelope travelled inside the server's, as its extra_key
            assert f"request {rid} carries a tenant envelope this server did not seal" in r.stderr, r.stderr[-2000:]


def test_twin_a_channel_that_believes_unverified_envelopes_lets_a_client_pick_the_tenant(jvm, tmp_path):
    r = _tenant_run(tmp_path, SGLANG_STUB_IO_STRUCT="msgspec", PLANTED="trusting-channel")
    # through an entry point that never sealed, the forged envelope and the replayed one now pick tenants
    assert "tenants ['acme', 'default', 'initech', 'default', 'globex', 'acme']" in r.stdout, r.stdout


def test_channel_opens_only_its_own_envelopes_for_their_request(tmp_path):
    from kvshield_sglang.tenants import TenantChannel

    ours = TenantChannel.from_rank_dir(str(tmp_path))
    assert TenantChannel.from_rank_dir(str(tmp_path))._key == ours._key  # every process of the server: one key
    assert oct((tmp_path / TenantChannel.KEY_FILE).stat().st_mode & 0o777) == "0o600"
    sealed = ours.seal("r1", "acme", "ns-1")
    assert ours.open("r1", sealed) == (True, "acme", "ns-1")
    assert ours.open("r1", ours.seal("r1", None, None)) == (True, None, None)
    assert ours.open("r2", sealed) == (False, None, sealed)  # bound to its request id
    payload, mac = sealed.rsplit(".", 1)
    for bad in [TenantChannel(b"x" * 32).seal("r1", "acme", "ns-1"), payload + "." + "0" * len(mac),
                TenantChannel.PREFIX + "e30." + mac, sealed + "\u00e9", "ns-1", None, 7]:
        assert ours.open("r1", bad) == (False, None, bad)
    assert "key" not in repr(ours).replace("key=<hidden>", "")


def test_missing_hook_targets_are_logged_and_installed_nowhere(caplog):
    from kvshield_sglang import engine_hooks
    from kvshield_sglang.tenants import TenantResolver

    class SlotsOnly:  # a msgspec Struct keeps no per-instance dict
        __slots__ = __struct_fields__ = ("rid",)

    class SlotsWithExtraKey:  # the field, but no TokenizerManager._create_tokenized_object to seal it in
        __slots__ = __struct_fields__ = ("rid", "extra_key")

    class TokenizerManager:
        async def generate_request(self, obj, request=None):
            yield obj

    resolver = TenantResolver("X-Tenant")
    original = TokenizerManager.generate_request
    with caplog.at_level(logging.ERROR, logger="kvshield_sglang.engine_hooks"):
        assert not engine_hooks.install_tokenizer_side(None, SlotsOnly, resolver, None)
        assert not engine_hooks.install_tokenizer_side(TokenizerManager, SlotsOnly, resolver, None)
        assert not engine_hooks.install_tokenizer_side(TokenizerManager, SlotsWithExtraKey, resolver, None)
        assert not engine_hooks.install_scheduler_side(None, SlotsOnly, None)
        assert not engine_hooks.install_forward_hook(object)
    assert TokenizerManager.generate_request is original
    text = caplog.text
    assert "no TokenizerManager.generate_request; every request goes to the default tenant" in text
    assert "takes an extra attribute, nor one with an extra_key field built by" in text
    assert "no Scheduler.handle_generate_request" in text
    assert "no ModelRunner.forward" in text
