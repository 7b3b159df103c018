"""The trusted tenant end to end on SGLang's own request path: gateway header (or API key) in the HTTP
process's ``TokenizerManager.generate_request`` → the tokenized request (a msgspec Struct: the tenant travels
sealed in ``extra_key``) pickled across → the scheduler's ``handle_generate_request`` → its ``Req`` → page
attribution in SGLang's prefill step; and a hook target this SGLang lacks stops the rank, named."""

import json

import scenarios
from conftest import TEST_CLASSES

TENANT_RUN = r"""
import os, pickle, torch
from kvshield_sglang import plugin
from kvshield_sglang.engine_hooks import client_extra_key, tree_namespace
from kvshield_sglang.tenants import TenantChannel, TenantResolver
if os.environ.get("PLANTED") == "trusting-channel":  # planted bug: an envelope is believed without its MAC
    def _trusting_open(self, rid, value):
        import base64, json
        if not isinstance(value, str) or not value.startswith(self.PREFIX):
            return False, None, value
        tenant, original = json.loads(base64.urlsafe_b64decode(value[len(self.PREFIX):].rpartition(".")[0]))[:2]
        return True, tenant, original
    TenantChannel.open = _trusting_open
plugin.load()
import servers
from fakes import MHAPool
from sglang.srt.managers.io_struct import GenerateReqInput
import sglang.srt.mem_cache.allocator.paged as paged

servers.publish_server_args(attention_backend="torch_native")

class Request:  # FastAPI's request, as the HTTP entry points pass it: headers only matter here
    def __init__(self, headers):
        self.headers = headers

attacker = TenantChannel(b"k" * 32)  # a client's own key: envelopes of the right shape, not this server's
forged = attacker.seal("r2", "globex", None)
tm = servers.tokenizer_manager()
servers.send(tm, GenerateReqInput(input_ids=[1, 2, 3, 4], rid="r1", extra_key="ns-1"),
             Request({"X-Tenant": "acme", "x-kvshield-tenant": "globex"}))
servers.send(tm, GenerateReqInput(input_ids=[5, 6, 7], rid="r2", extra_key=forged), Request({}))
servers.send(tm, GenerateReqInput(input_ids=[1], rid="r3"), Request({"authorization": "Bearer key-7"}))
servers.send(tm, GenerateReqInput(input_ids=[1], rid="r4"), None)  # the engine API: no HTTP request
wire = [pickle.dumps(t) for t in tm.sent]  # the process boundary: only what pickles crosses
genuine = tm.sent[0].extra_key  # what the tokenizer sealed for r1 (a client never sees it)
# An entry point that never sealed (e.g. gRPC) hands the scheduler the client's extra_key as is:
for rid, extra in (("r5", attacker.seal("r5", "globex", None)), ("r6", genuine)):  # r6 replays r1's envelope
    t = pickle.loads(wire[3])
    t.rid, t.extra_key = rid, extra
    wire.append(pickle.dumps(t))

s = servers.scheduler()
for blob in wire:
    s.handle_generate_request(pickle.loads(blob))
reqs = s.waiting_queue
resolver = TenantResolver.from_env()
print("tenants", [resolver.resolve_request(r) for r in reqs])
# the client's part of each tree namespace (the tenant's comes first: engine_hooks.tree_namespace)
client = [client_extra_key(r.extra_key) for r in reqs]
print("extra_keys", client[:4:2], client[1] == forged, client[3], client[4] == pickle.loads(wire[4]).extra_key,
      client[5] == genuine)
print("scoped", all(r.extra_key == tree_namespace(resolver.resolve_request(r), c) for r, c in zip(reqs, client)))
print("sealed on the wire", isinstance(genuine, str) and genuine.startswith(TenantChannel.PREFIX) and "acme" not in genuine)

a = paged.PagedTokenToKVPoolAllocator(512, 4, torch.float32, "cpu", MHAPool(512, 4), False)
batch = servers.prefill(servers.radix_cache(a), reqs[:2])
print("owners", [a.page_owner(int(s) // 4)[0] for s in batch.out_cache_loc[::4]])
"""


def _tenant_run(tmp_path, **env):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"key-7": "initech"}))
    r = scenarios.run(scenarios.script(TENANT_RUN), tmp_path, TEST_CLASSES, KVSHIELD_TENANT_HEADER="X-Tenant",
                      KVSHIELD_API_KEY_MAP=str(keys), KVSHIELD_ADVERTISED_CONTEXT_TOKENS="512", **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r


def test_gateway_tenant_travels_from_the_http_request_to_the_schedulers_pages(jvm, tmp_path):
    r = _tenant_run(tmp_path)
    assert "tenants ['acme', 'default', 'initech', 'default', 'default', 'default']" in r.stdout, r.stdout
    # SGLang sees each request's own extra_key, whatever travelled in it
    assert "extra_keys ['ns-1', None] True None True True" in r.stdout, r.stdout
    assert "scoped True" in r.stdout, r.stdout
    assert "sealed on the wire True" in r.stdout, r.stdout
    assert "owners ['acme', 'default']" in r.stdout, r.stdout
    for rid in ("r5", "r6"):  # r2's forged envelope travelled inside the server's, as its extra_key
        assert f"request {rid} carries a tenant envelope this server did not seal" in r.stderr, r.stderr[-2000:]


def test_twin_a_channel_that_believes_unverified_envelopes_lets_a_client_pick_the_tenant(jvm, tmp_path):
    r = _tenant_run(tmp_path, PLANTED="trusting-channel")
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


MISMATCH_RUN = r"""
import sglang.srt.managers.tokenizer_manager as tm_module
import sglang.srt.model_executor.model_runner as runner_module
from kvshield_sglang import hooks, plugin

async def generate_request(self, obj):  # an SGLang whose entry point takes no FastAPI request
    yield obj

original = tm_module.TokenizerManager.generate_request = generate_request
del runner_module.ModelRunner.forward
plugin.load()
assert tm_module.TokenizerManager.generate_request is original  # installed nowhere
for line in hooks.failed():
    print("FAILED", line)
"""


def test_a_target_this_sglang_lacks_or_shaped_otherwise_is_recorded_and_installed_nowhere(jvm, tmp_path):
    r = scenarios.run(scenarios.script(MISMATCH_RUN), tmp_path, TEST_CLASSES)
    assert r.returncode == 0, r.stderr[-3000:]
    failed = [line for line in r.stdout.splitlines() if line.startswith("FAILED")]
    assert len(failed) == 2, r.stdout
    assert ("FAILED tenant-tokenizer: HookError: TokenizerManager.generate_request(self, obj) does not match what "
            "kvshield wraps: needs leading parameters (self, obj, request)") in failed, failed
    assert "FAILED forward-launch: HookError: sglang.srt.model_executor.model_runner.ModelRunner.forward does not exist" \
        in failed, failed
