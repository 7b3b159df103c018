"""The trusted tenant end to end on SGLang's own request path: gateway header (or API key) in the HTTP
process's ``TokenizerManager.generate_request`` → the tokenized request (a msgspec Struct: the tenant travels
sealed in ``extra_key``) pickled across → the scheduler's ``handle_generate_request`` → its ``Req`` → page
attribution in SGLang's prefill step; and a hook target this SGLang lacks stops the rank, named."""

import json

import pytest

import scenarios
from conftest import TEST_CLASSES
from server_scenarios import run_scenario, scheduler_scenario, tokenizer_scenario

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


# --------------------------------------------------------------------------------------------------------------
# The gateway's tenant does not reach an embedding request's Req (it runs as the default tenant).
# --------------------------------------------------------------------------------------------------------------

EMBEDDING_TENANT = scheduler_scenario(r"""
import pickle
from kvshield_sglang.tenants import TenantResolver
from sglang.srt.managers.io_struct import EmbeddingReqInput, GenerateReqInput

class Request:  # FastAPI's request as the HTTP entry points pass it: headers only matter here
    def __init__(self, headers):
        self.headers = headers

tm = servers.tokenizer_manager()
servers.send(tm, GenerateReqInput(input_ids=[1, 2, 3, 4], rid="g1"), Request({"X-Tenant": "acme"}))
servers.send(tm, EmbeddingReqInput(input_ids=[1, 2, 3, 4], rid="e1"), Request({"X-Tenant": "acme"}))
OUT["sent"] = [type(t).__name__ for t in tm.sent]
s = servers.scheduler()
s.disable_radix_cache = False
for t in tm.sent:
    t = pickle.loads(pickle.dumps(t))  # the process boundary
    if type(t).__name__ == "TokenizedEmbeddingReqInput":
        s.handle_embedding_request(t)
    else:
        s.handle_generate_request(t)
resolver = TenantResolver.from_env()
OUT["tenants"] = {q.rid: resolver.resolve_request(q) for q in s.waiting_queue}
""")


def test_an_embedding_requests_gateway_tenant_reaches_its_req(jvm, tmp_path):
    """README, "Trusted tenant, end to end": in the HTTP process ``TokenizerManager.generate_request`` ("every HTTP
    entry point hands it the FastAPI request") resolves the tenant from the gateway header, and "each ``Req``
    built" in the scheduler takes it over; the planning hook attributes pages to it. SGLang's embedding entry
    points (/v1/embeddings, /encode) go through the same ``generate_request`` with an ``EmbeddingReqInput``, but
    the seal is applied to ``TokenizedGenerateReqInput`` only and only ``Scheduler.handle_generate_request`` is
    hooked: the ``Req`` built by ``Scheduler.handle_embedding_request`` carries no tenant and runs as the
    default tenant. acme's embedding prefills are then attributed to (and audited, quota-counted and
    prefix-cache-namespaced as) the default tenant, shared by every tenant's embeddings. Expected: 'acme' (or
    the request refused), never the default tenant silently."""
    out = run_scenario(tmp_path, EMBEDDING_TENANT, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["sent"] == ["TokenizedGenerateReqInput", "TokenizedEmbeddingReqInput"], out
    assert out["tenants"]["g1"] == "acme", out
    assert out["tenants"]["e1"] == "acme", f"the embedding request's gateway tenant was dropped: {out}"


EMBEDDING_BATCHES = scheduler_scenario(r"""
import pickle
from kvshield_sglang import hooks
from kvshield_sglang.tenants import TenantChannel, TenantResolver
from sglang.srt.managers.io_struct import BatchTokenizedEmbeddingReqInput, EmbeddingReqInput

class Request:
    def __init__(self, headers):
        self.headers = headers

tm = servers.tokenizer_manager()
for rid, ids, tenant, lora in (("e1", [1, 2, 3, 4], "acme", "lora-7"), ("e2", [5, 6, 7, 8], "globex", None),
                               ("e3", [9, 10, 11, 12], "initech", None)):
    servers.send(tm, EmbeddingReqInput(input_ids=ids, rid=rid, lora_id=lora), Request({"X-Tenant": tenant}))
OUT["sealed"] = [isinstance(t.lora_id, str) and t.lora_id.startswith(TenantChannel.PREFIX) for t in tm.sent]
wire = [pickle.loads(pickle.dumps(t)) for t in tm.sent]  # the process boundary
s = servers.scheduler()
s.disable_radix_cache = False
with servers.single_rank():
    s.handle_embedding_request(wire[0])
    s.handle_batch_embedding_request(pickle.loads(pickle.dumps(BatchTokenizedEmbeddingReqInput(batch=wire[1:]))))
resolver = TenantResolver.from_env()
reqs = s.waiting_queue
OUT["tenants"] = {q.rid: resolver.resolve_request(q) for q in reqs}
OUT["lora_ids"] = {q.rid: q.lora_id for q in reqs}  # SGLang sees each request's own value
OUT["aborted"] = {q.rid: q.to_finish.message for q in reqs if q.to_finish is not None}
a, kv = allocator(4)
with servers.single_rank():
    batch = servers.prefill(servers.radix_cache(a), [q for q in reqs if q.to_finish is None])
OUT["owners"] = {r.rid: a.page_owner(int(batch.req_to_token_pool.req_to_token[r.req_pool_idx, 0]) // 4)[0]
                 for r in batch.reqs} if batch is not None else {}
OUT["failed"] = hooks.failed()
""")


_NO_EMBEDDING_CARRIER = """
from kvshield_sglang import engine_hooks  # planted bug: the scheduler opens generate requests' envelopes only
_stock_install, _stock_check = engine_hooks.install_scheduler_side, engine_hooks.check_every_tokenized_type
def _generate_only(resolver, channel=None):
    kept = engine_hooks.CARRIERS, engine_hooks.BATCHES
    engine_hooks.CARRIERS, engine_hooks.BATCHES = kept[0][:1], kept[1][:1]
    engine_hooks.check_every_tokenized_type = lambda resolver: None
    try:
        _stock_install(resolver, channel)
    finally:
        (engine_hooks.CARRIERS, engine_hooks.BATCHES), engine_hooks.check_every_tokenized_type = kept, _stock_check
engine_hooks.install_scheduler_side = _generate_only
"""


def test_every_embedding_entry_seals_its_tenant_and_its_pages_are_that_tenants(jvm, tmp_path):
    """The embedding path end to end: single and batched (``BatchTokenizedEmbeddingReqInput``, which SGLang's
    scheduler hands item by item to ``handle_embedding_request``) embedding requests carry the gateway tenant
    sealed in ``lora_id`` (the client's value is back before SGLang sees it), and the pages their prefill takes
    are that tenant's."""
    out = run_scenario(tmp_path, EMBEDDING_BATCHES, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["failed"] == [] and out["sealed"] == [True] * 3 and out["aborted"] == {}, out
    assert out["tenants"] == {"e1": "acme", "e2": "globex", "e3": "initech"}, out
    assert out["lora_ids"] == {"e1": "lora-7", "e2": None, "e3": None}, out
    assert out["owners"] == out["tenants"], out


def test_twin_an_embedding_seal_left_out_runs_every_embedding_as_the_default_tenant(jvm, tmp_path):
    out = run_scenario(tmp_path, EMBEDDING_BATCHES, plant=_NO_EMBEDDING_CARRIER, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["tenants"] == {"e1": "default", "e2": "default", "e3": "default"}, out
    assert out["owners"] == out["tenants"], out


_DIRECT_BATCH = """
from sglang.srt.managers import scheduler as _sm
def _direct(self, recv_req):  # an SGLang whose batch handler builds each Req itself
    for t in recv_req:
        self._add_request_to_queue(_sm.Req(t.rid, t.input_text, t.input_ids, t.sampling_params))
_sm.Scheduler.handle_batch_embedding_request = _direct
"""


def test_a_req_a_batch_handler_builds_itself_is_aborted_not_run_as_the_default_tenant(jvm, tmp_path):
    out = run_scenario(tmp_path, EMBEDDING_BATCHES, plant=_DIRECT_BATCH, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["tenants"]["e1"] == "acme" and out["owners"] == {"e1": "acme"}, out
    for rid in ("e2", "e3"):
        assert out["aborted"][rid] == (f"kvshield: request {rid} of a BatchTokenizedEmbeddingReqInput was built "
                                       "outside its item's handler: no tenant"), out
    # no tenant source configured: every request is the default tenant's anyway, nothing to refuse
    out = run_scenario(tmp_path, EMBEDDING_BATCHES, plant=_DIRECT_BATCH)
    assert out["aborted"] == {} and set(out["tenants"].values()) == {"default"}, out


UNKNOWN_TYPE = scheduler_scenario(r"""
from kvshield_sglang import hooks
OUT["failed"] = hooks.failed()
""")


_NEW_TOKENIZED_TYPE = """
import sglang.srt.managers.io_struct as _io
class TokenizedScoreReqInput(_io.BaseReq, kw_only=True):  # an SGLang with a request type kvshield cannot seal
    input_ids: list = []
_io.TokenizedScoreReqInput = TokenizedScoreReqInput
"""


@pytest.mark.parametrize("planted", [False, True])
def test_a_tokenized_request_type_without_a_tenant_carrier_stops_the_rank(jvm, tmp_path, planted):
    plant = _NEW_TOKENIZED_TYPE + ("from kvshield_sglang import engine_hooks\n"
                                   "engine_hooks.check_every_tokenized_type = lambda resolver: None\n" if planted else "")
    out = run_scenario(tmp_path, UNKNOWN_TYPE, plant=plant, KVSHIELD_TENANT_HEADER="X-Tenant")
    failed = [f for f in out["failed"] if "TokenizedScoreReqInput" in f]
    if planted:  # twin: the check left out, the new type's requests would run as the default tenant unnoticed
        assert failed == [], out
        return
    assert [f.split(":")[0] for f in failed] == ["tenant-tokenizer", "tenant-scheduler"], out
    assert "cannot carry the tenant of SGLang's TokenizedScoreReqInput" in failed[0], out
    assert run_scenario(tmp_path, UNKNOWN_TYPE, plant=plant)["failed"] == []  # no tenant configured: nothing to carry


UNSEALABLE = scheduler_scenario(r"""
import msgspec
from sglang.srt.managers.io_struct import GenerateReqInput

class Request:
    def __init__(self, headers):
        self.headers = headers

tm = servers.tokenizer_manager()
try:
    servers.send(tm, GenerateReqInput(input_ids=[1, 2, 3], rid="u1"), Request({"X-Tenant": "acme"}))
    OUT["sent"] = [type(t).__name__ for t in tm.sent]
except ValueError as e:
    OUT["refused"] = str(e)
""")


_UNSEALABLE_TYPE = """
import msgspec
from sglang.srt.managers.tokenizer_manager import TokenizerManager as _TM
from sglang.srt.observability.req_time_stats import APIServerReqTimeStats
class OtherReqInput(msgspec.Struct):  # an SGLang whose tokenizer builds a request type kvshield has no carrier for
    rid: str
    mm_inputs: object = None
    time_stats: object = msgspec.field(default_factory=APIServerReqTimeStats)
    def wrap_pickle_fields(self):
        pass
    def unwrap_pickle_fields(self):
        pass
_TM._create_tokenized_object = lambda self, obj, *a, **k: OtherReqInput(rid=obj.rid)
"""


def test_the_tokenizer_refuses_a_tokenized_request_it_cannot_seal(jvm, tmp_path):
    out = run_scenario(tmp_path, UNSEALABLE, plant=_UNSEALABLE_TYPE, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out == {"refused": "kvshield cannot carry the tenant of request u1 (OtherReqInput): refused"}, out
    assert run_scenario(tmp_path, UNSEALABLE, plant=_UNSEALABLE_TYPE) == {"sent": ["OtherReqInput"]}  # no tenant configured


def test_twin_a_tokenizer_that_passes_an_unsealable_request_on_sends_it_unattributed(jvm, tmp_path):
    plant = _UNSEALABLE_TYPE + ("from kvshield_sglang import engine_hooks  # planted bug: unknown types pass unsealed\n"
                                "_stock_seal = engine_hooks._seal_on_create\n"
                                "engine_hooks._seal_on_create = lambda m, c, ch, r: _stock_seal(m, c, ch, "
                                "type(r)(None, None, r.default_tenant))\n")
    out = run_scenario(tmp_path, UNSEALABLE, plant=plant, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out == {"sent": ["OtherReqInput"]}, out


# --------------------------------------------------------------------------------------------------------------
# Parallel sampling (n > 1) strips the gateway's tenant: every copy runs as the default tenant.
# --------------------------------------------------------------------------------------------------------------
PARALLEL_SAMPLING = tokenizer_scenario(r"""
tm = servers.tokenizer_manager()
servers.send(tm, GenerateReqInput(input_ids=[1, 2, 3, 4, 5, 6, 7, 8], rid="p1",
                                  sampling_params={"n": 2, "max_new_tokens": 4}), Request({"X-Tenant": "acme"}))
servers.send(tm, GenerateReqInput(input_ids=[9, 10, 11, 12], rid="single"), Request({"X-Tenant": "acme"}))
s = servers.scheduler()
for t in tm.sent:  # the process boundary: only what pickles crosses
    s.handle_generate_request(pickle.loads(pickle.dumps(t)))
resolver = TenantResolver.from_env()
OUT["tenants"] = [resolver.resolve_request(r) for r in s.waiting_queue]
OUT["client_extra_keys_are_envelopes"] = [str(r.extra_key).count("kvshield-tenant/1:") for r in s.waiting_queue]
a = paged.PagedTokenToKVPoolAllocator(512, 4, torch.float32, "cpu", MHAPool(512, 4), False)
batch = servers.prefill(servers.radix_cache(a), s.waiting_queue[:1])   # the n>1 request's prefix-caching copy
OUT["owners"] = sorted({a.page_owner(int(x) // 4)[0] for x in batch.out_cache_loc})
""")


def test_parallel_sampling_copies_keep_the_gateways_tenant(jvm, tmp_path):
    """Promise (README "Settings"/engine_hooks docstring: the gateway's tenant header or API key decides a request's
    tenant; "every ``Req`` built inside takes the tenant over"; "neither runs as the default tenant"; README: "every
    page is attributed to its request and tenant").

    What happens: a generate request with ``n > 1`` (parallel sampling) is tokenized once, the envelope sealed into
    ``extra_key`` for the client's ``rid``; SGLang's ``TokenizerManager._handle_batch_request`` then sends a
    prefix-caching copy and ``n`` sample copies, each a ``copy.copy`` of the tokenized request with a fresh rid
    (``regenerate_rid()``). The envelope's MAC is bound to the old rid, so the scheduler's ``received_tenant`` rejects
    it ("carries a tenant envelope this server did not seal") and every copy runs as the DEFAULT tenant, with the
    sealed envelope left in its ``extra_key``. The tenant's KV pages are owned by (attributed to, quota-counted
    against, sealed under the key of, audited as) the default tenant; a regulated tenant's sampling requests escape
    COMPLIANCE; a tenant escapes its quota by asking ``n=2``. A plain request of the same client keeps ``acme``.

    Severity: high (tenant identity stripped for a whole ordinary request class; wrong key/audit/quota).
    Cause: ``engine_hooks._seal_on_create`` binds the envelope to ``out.rid`` at tokenization, but SGLang's
    ``_handle_batch_request`` (parallel-sample branch) re-rids the copies after sealing; ``received_tenant``
    (engine_hooks) then sees a MAC for another rid."""
    out = run_scenario(tmp_path, PARALLEL_SAMPLING)
    assert out["tenants"][-1] == "acme", out                       # control: the plain request keeps its tenant
    assert out["tenants"] == ["acme"] * 4, out                     # prefix copy + 2 samples + plain
    assert out["client_extra_keys_are_envelopes"] == [0] * 4, out   # SGLang sees the client's extra_key, not ours
    assert out["owners"] == ["acme"], out


def test_twin_copies_keeping_the_first_ids_envelope_run_as_the_default_tenant(jvm, tmp_path):
    out = run_scenario(tmp_path, PARALLEL_SAMPLING, PLANTED="no-rebind")
    assert out["tenants"] == ["default", "default", "default", "acme"], out


# --------------------------------------------------------------------------------------------------------------
# SGLang's gRPC bridge hands TokenizerManager.generate_request a request shim whose headers have no items():
#    with kvshield loaded every request through it fails in the tenant resolver.
# --------------------------------------------------------------------------------------------------------------
GRPC_SHIM = tokenizer_scenario(r"""
from sglang.srt.entrypoints.grpc_bridge import _GrpcRequest
tm = servers.tokenizer_manager()
OUT["errors"] = {}
for name, req in (("generate", _GrpcRequest(is_disconnected_fn=lambda: False)),     # RuntimeHandle.submit_request
                  ("openai", _GrpcRequest(headers={"traceparent": "00-1-2-01"}))):  # _run_openai_request
    try:
        servers.send(tm, GenerateReqInput(input_ids=[1, 2, 3], rid="grpc-" + name), req)
    except Exception as e:
        OUT["errors"][name] = repr(e)
OUT["sent"] = len(tm.sent)
s = servers.scheduler()
for t in tm.sent:
    s.handle_generate_request(pickle.loads(pickle.dumps(t)))
OUT["tenants"] = [TenantResolver.from_env().resolve_request(r) for r in s.waiting_queue]
from sglang.srt.managers.tokenizer_manager import TokenizerManager   # control: SGLang's own entry point serves it
TokenizerManager.generate_request = TokenizerManager.generate_request.__wrapped__
stock = servers.tokenizer_manager()
servers.send(stock, GenerateReqInput(input_ids=[1, 2, 3], rid="grpc-stock"), _GrpcRequest(is_disconnected_fn=lambda: False))
OUT["stock_sent"] = len(stock.sent)
""")


def test_requests_through_sglangs_grpc_bridge_are_served(jvm, tmp_path):
    """Promise (README "Known limits": requests through entry points other than SGLang's HTTP ones (gRPC) "go to the
    default tenant"; engine_hooks: "every HTTP entry point passes the FastAPI request to it" and the hook only
    resolves a tenant; README: a hook never refuses a legit SGLang path).

    What happens: SGLang's gRPC bridge (``entrypoints/grpc_bridge.py``: ``RuntimeHandle.submit_request`` for generate and
    embed, ``_run_openai_request`` for the OpenAI routes) calls ``TokenizerManager.generate_request(obj, request=shim)``
    with a ``_GrpcRequest`` whose ``headers`` is a ``_CaseInsensitiveHeaders`` (only ``get``). kvshield's
    ``generate_request`` wrapper calls ``TenantResolver.resolve_http(headers)``, which iterates ``headers.items()``:
    ``AttributeError: '_CaseInsensitiveHeaders' object has no attribute 'items'`` before the request is tokenized,
    for every request, tenants configured or not. The whole gRPC serving path is down once kvshield is loaded (SGLang
    itself only reads these headers with tracing on).

    Severity: medium (availability of a supported SGLang entry point; the documented fallback, default tenant, is
    never reached). Cause: ``engine_hooks.install_tokenizer_side.generate_request`` → ``tenants.TenantResolver
    .resolve_http`` assumes a Starlette ``Headers`` mapping (``.items()``)."""
    out = run_scenario(tmp_path, GRPC_SHIM)
    assert out["stock_sent"] == 1, out                         # without kvshield's wrapper the shim is served
    assert not out["errors"], f"requests through SGLang's gRPC bridge fail in kvshield's hook: {out['errors']}"
    assert out["sent"] == 2 and out["tenants"] == ["default", "default"], out


def test_twin_headers_read_through_items_only_fail_the_grpc_bridge(jvm, tmp_path):
    out = run_scenario(tmp_path, GRPC_SHIM, PLANTED="items-only")
    assert "AttributeError" in out["errors"].get("generate", "") and out["sent"] == 0, out
