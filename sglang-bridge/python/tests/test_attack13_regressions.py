"""Thirteenth attack round: defects found in the tenant transport, parallel sampling and the newest session fixes.
Each test failed on the code it was written against because of the defect it names; each twin plants the defect
back and must fail. Each runs in a subprocess (the plug-in replaces SGLang's classes process-wide)
on the real upstream SGLang (``servers``: SGLang's own ``TokenizerManager.generate_request`` /
``_handle_batch_request`` and ``Scheduler.handle_generate_request``; kvshield's allocator)."""

import scenarios
from conftest import TEST_CLASSES

_MARK = "ATTACK13 "

_PRELUDE = r"""
import json, os, pickle, torch
from kvshield_sglang import plugin, tenants
PLANTED = os.environ.get("PLANTED")
if PLANTED == "no-rebind":           # a copy sent under a new id keeps the envelope sealed for the first id
    tenants.TenantChannel.rebind = lambda self, value, rid: value
elif PLANTED == "items-only":        # headers read through items() only (Starlette's), as before the fix
    tenants._header = lambda headers, name: next((v for k, v in headers.items() if k.lower() == name), None)
elif PLANTED in ("open-unchecked", "unchecked"):  # an open may take an id whose streaming slot is still held
    plugin._streaming_slots = lambda tree_cache: {}
if PLANTED == "unchecked":           # and a turn's match restores a slot kept for another session object
    plugin._kept_for_another = lambda slot, session: False
plugin.load()
import servers
from fakes import MHAPool
from kvshield_sglang.tenants import TenantResolver
from sglang.srt.managers.io_struct import GenerateReqInput
import sglang.srt.mem_cache.allocator.paged as paged
servers.publish_server_args(attention_backend="torch_native")
OUT = {}
class Request:  # FastAPI's request as the HTTP entry points pass it: only its headers matter here
    def __init__(self, headers):
        self.headers = headers
def done():
    print("ATTACK13 " + json.dumps(OUT))
"""


def _run(tmp_path, body, **env):
    env.setdefault("KVSHIELD_TENANT_HEADER", "X-Tenant")
    env.setdefault("KVSHIELD_ADVERTISED_CONTEXT_TOKENS", "512")
    return scenarios.run_reporting(_PRELUDE + body + "\ndone()\n", _MARK, tmp_path, TEST_CLASSES, **env)


# --------------------------------------------------------------------------------------------------------------
# 1. Parallel sampling (n > 1) strips the gateway's tenant: every copy runs as the default tenant.
# --------------------------------------------------------------------------------------------------------------
PARALLEL_SAMPLING = r"""
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
"""


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
    out = _run(tmp_path, PARALLEL_SAMPLING)
    assert out["tenants"][-1] == "acme", out                       # control: the plain request keeps its tenant
    assert out["tenants"] == ["acme"] * 4, out                     # prefix copy + 2 samples + plain
    assert out["client_extra_keys_are_envelopes"] == [0] * 4, out   # SGLang sees the client's extra_key, not ours
    assert out["owners"] == ["acme"], out


def test_twin_copies_keeping_the_first_ids_envelope_run_as_the_default_tenant(jvm, tmp_path):
    out = _run(tmp_path, PARALLEL_SAMPLING, PLANTED="no-rebind")
    assert out["tenants"] == ["default", "default", "default", "acme"], out


# --------------------------------------------------------------------------------------------------------------
# 2. A streaming session closed while its turn runs leaves its slot (deferred release) keyed by the session id;
#    another tenant re-opens that id and its first turn is restored onto the first tenant's KV.
# --------------------------------------------------------------------------------------------------------------
SESSION_ID_REUSE = r"""
from array import array
from kvshield_sglang import engine_hooks
import session_world
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.managers.io_struct import CloseSessionReqInput, OpenSessionReqInput, SessionParams, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
def Tenant(tenant):
    return Request({"X-Tenant": tenant})
def tokenized(rid, ids):
    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=array("q", ids), input_embeds=None, mm_inputs=None, token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=4), return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=False, session_params=SessionParams(id="sa"))
with servers.single_rank():
    w = session_world.World("unified", 4)
    controller, tm, control = session_world.session_control(w)
    control(tm.open_session(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id="sa", streaming=True), Tenant("acme")))
    sa = controller.get("sa")
    OUT["bound"] = sa.kvshield_tenant
    SECRET = list(range(4000, 4012))
    with engine_hooks.building("acme"):
        t0 = sa.create_req(tokenized("acme-t0", SECRET), None, 100000)
    b = w._prefill(t0); w._write(b, t0, 1, 1); t0.kv_committed_len = len(SECRET)
    t0.finished_reason, t0.finished_len = FINISH_LENGTH(length=0), 0
    common.release_kv_cache(t0, w.cache)
    w.alloc.end_step()
    OUT["slot_after_t0"] = "sa" in w._slots()
    # T1: acme's next turn, accepted (in flight) but not matched yet (e.g. its grammar still compiles)
    with engine_hooks.building("acme"):
        t1 = sa.create_req(tokenized("acme-t1", [11, 12, 13]), None, 100000)
    # T2: the same client's duplicate turn, refused by create_req (in flight), matched first
    with engine_hooks.building("acme"):
        t2 = sa.create_req(tokenized("acme-t2", [20]), None, 100000)
    OUT["t2_refused"] = t2.to_finish is not None
    t2.init_next_round_input(w.cache)
    OUT["inflight_after_t2_match"] = bool(sa._inflight)
    b1 = w._prefill(t1); w._write(b1, t1, 1, 1); t1.kv_committed_len = len(t1.origin_input_ids)
    OUT["t1_prefix"] = len(t1.prefix_indices)
    # acme closes its session while T1 runs
    control(tm.close_session(CloseSessionReqInput(session_id="sa"), Tenant("acme")))
    OUT["sa_in_controller"] = "sa" in controller.sessions
    OUT["slot_still_there"] = "sa" in w._slots()
    # globex opens a session with the same id and sends a turn on it
    answers = control(tm.open_session(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id="sa", streaming=True),
                                      Tenant("globex")))
    OUT["open_answer"] = getattr(answers[0][1], "success", None)
    sb = controller.get("sa")
    OUT["new_bound"] = getattr(sb, "kvshield_tenant", None)
    if sb is None:
        done()
        raise SystemExit(0)
    with engine_hooks.building("globex"):
        u1 = sb.create_req(tokenized("globex-u1", list(range(9000, 9020))), None, 100000)
    u1.init_next_round_input(w.cache)
    got = w.kv.read(u1.prefix_indices.to(torch.int64))[0, :, 0, 0].tolist()
    OUT["u1_refused"] = u1.to_finish is not None
    OUT["u1_prefix_values"] = got
    OUT["u1_reads_acme"] = [i for i, v in enumerate(got) if int(v) // 10000 == 1]
    OUT["u1_row_is_t1_row"] = u1.req_pool_idx == t1.req_pool_idx
"""


def test_a_reopened_session_id_never_restores_another_tenants_deferred_slot(jvm, tmp_path):
    """Promise (README "Streaming sessions": "Each session is one pool holder, of the tenant that opened it"; "A
    request of another tenant naming the session is aborted ... before it reads anything"; "a close while a turn
    runs is deferred to that turn's end, so no release frees what a running turn reads"; overall: no request reads
    another tenant's KV).

    What happens (SGLang's own ``SessionController``, ``Session.create_req``, ``UnifiedRadixCache``'s embedded
    ``StreamingSession``, the tokenizer/scheduler open/close handlers): acme opens streaming session ``sa`` and runs
    turn T0 (its KV kept in the slot). acme's turn T1 is accepted (in flight) but not matched yet (e.g. still in
    SGLang's grammar queue, or behind a higher-priority request); the same client's duplicate T2 is refused by
    ``create_req`` ("already has an active request") and matched first: SGLang's ``find_active_slot`` detaches it
    with ``session.abort_req()``, clearing the in-flight flag (kvshield refuses a second turn only when a live turn
    exists already). T1 is then matched and runs (kvshield's live turn). acme's close now finds no in-flight turn:
    ``SessionController._close`` calls ``release_session`` (kvshield defers it: T1 is live, the slot stays) and
    deletes the session. globex opens a session with the same id ``sa`` (SGLang accepts it: the id is free) and
    sends a turn: kvshield's ``try_match_prefix`` checks the tenant of the *new* ``Session`` object (globex), not of
    the slot it restores (keyed by the id string), so SGLang restores acme's slot: globex's request gets acme's row
    (the one T1 runs on) and its prefix reads acme's 12 tokens of KV.

    Severity: critical (cross-tenant KV read, content proven; globex's turn also shares and extends the row of
    acme's running T1). Needs the session id (client-chosen ids are often predictable).
    Cause: ``plugin._install_streaming_sessions.try_match_prefix`` trusts ``req.session.kvshield_tenant`` and never
    compares the slot's owner (``slot.kvshield_session``); the deferred ``release_session`` leaves
    ``StreamingSession.slots[session_id]`` after SGLang deleted the session, and ``plugin._install_session_control``'s
    ``open_session`` lets a new session take an id whose slot is still held."""
    out = _run(tmp_path, SESSION_ID_REUSE, KVSHIELD_TENANT_HEADER="x-tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64")
    assert out["bound"] == "acme" and out["t1_prefix"] == 12, out         # T1 ran on acme's kept KV
    assert out["new_bound"] is None and out["open_answer"] is False, (
        f"globex reopened the id of acme's session whose KV T1 still runs on: {out}")


def test_a_turn_never_restores_a_slot_kept_for_another_session_object(jvm, tmp_path):
    """The second check behind the open's: with the open's check planted off (globex's open succeeds), globex's turn
    on the reopened id is refused at its match and reads none of acme's KV."""
    out = _run(tmp_path, SESSION_ID_REUSE, KVSHIELD_TENANT_HEADER="x-tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64",
               PLANTED="open-unchecked")
    assert out["new_bound"] == "globex" and out["u1_refused"], out
    assert not out["u1_reads_acme"] and not out["u1_row_is_t1_row"], (
        f"isolation: globex's turn on the re-opened session id reads acme's KV at positions {out['u1_reads_acme']} "
        f"(values {out['u1_prefix_values']}; shares T1's row: {out['u1_row_is_t1_row']})")


def test_twin_without_either_check_a_reopened_id_reads_the_first_tenants_kv(jvm, tmp_path):
    out = _run(tmp_path, SESSION_ID_REUSE, KVSHIELD_TENANT_HEADER="x-tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64",
               PLANTED="unchecked")
    assert out["u1_reads_acme"] and out["u1_row_is_t1_row"], out


# --------------------------------------------------------------------------------------------------------------
# 3. SGLang's gRPC bridge hands TokenizerManager.generate_request a request shim whose headers have no items():
#    with kvshield loaded every request through it fails in the tenant resolver.
# --------------------------------------------------------------------------------------------------------------
GRPC_SHIM = r"""
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
"""


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
    out = _run(tmp_path, GRPC_SHIM)
    assert out["stock_sent"] == 1, out                         # without kvshield's wrapper the shim is served
    assert not out["errors"], f"requests through SGLang's gRPC bridge fail in kvshield's hook: {out['errors']}"
    assert out["sent"] == 2 and out["tenants"] == ["default", "default"], out


def test_twin_headers_read_through_items_only_fail_the_grpc_bridge(jvm, tmp_path):
    out = _run(tmp_path, GRPC_SHIM, PLANTED="items-only")
    assert "AttributeError" in out["errors"].get("generate", "") and out["sent"] == 0, out
