"""Ninth attack round: defects found by driving the bridge through SGLang code paths earlier rounds covered least
(streaming sessions, embeddings, speculative decoding's quota, the PP profiler). Each test states the promise it
checks (README / docstring) and failed on the code it was written against, because of the defect it names; each
twin plants that defect back and must fail. Each runs in a subprocess (the plug-in replaces SGLang's classes
process-wide), on the real SGLang (``servers`` builds SGLang's own Req, ReqToTokenPool, UnifiedRadixCache,
PrefillAdder and ScheduleBatch; ``Session`` is SGLang's own session controller class)."""

import pytest
import scenarios
from conftest import TEST_CLASSES

_MARK = "ATTACK9 "

_PRELUDE = r"""
import json, os, torch
from kvshield_sglang import plugin
plugin.load()
import servers
from fakes import MHAPool
import sglang.srt.mem_cache.allocator.paged as paged
import sglang.srt.mem_cache.allocator.token as token
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.session.session_controller import Session
servers.publish_server_args(attention_backend="torch_native")
OUT = {}
def done():
    print("ATTACK9 " + json.dumps(OUT))

def allocator(ps, size=64):
    kv = MHAPool(size, ps)
    if ps == 1:
        return token.TokenToKVPoolAllocator(size, torch.float32, "cpu", kv, False), kv
    return paged.PagedTokenToKVPoolAllocator(size, ps, torch.float32, "cpu", kv, False), kv

def write(kv, slots, value):
    for b in kv.buffers():
        b[slots] = value

def first_turn(a, kv, cache, sess, tokens, value):
    # One streaming-session turn as SGLang runs it: the session's request is admitted and prefilled
    # (PrefillAdder + prepare_for_extend), the forward writes its KV, it finishes and the scheduler
    # releases it (release_kv_cache: UnifiedRadixCache's embedded StreamingSession keeps its KV in the
    # session slot for the next turn).
    req = servers.request("turn1", tokens, "acme", session=sess)
    sess._inflight = True  # Session.create_req sets it for a streaming turn
    with servers.single_rank():
        batch = servers.prefill(cache, [req])
    write(kv, batch.out_cache_loc, value)
    req.kv_committed_len = len(tokens)
    req.finished_reason, req.finished_len = FINISH_LENGTH(length=0), 0
    row = req.req_pool_idx
    common.release_kv_cache(req, cache)
    return cache.req_to_token_pool.req_to_token[row, :len(tokens)].to(torch.int64)
"""


def _run(tmp_path, body, plant="", **env):
    """Runs ``body`` after the prelude; ``plant`` runs before the plug-in loads (a planted bug, or an SGLang variant)."""
    code = _PRELUDE.replace("plugin.load()\n", plant + "\nplugin.load()\n", 1) + body + "\ndone()\n"
    return scenarios.run_reporting(code, _MARK, tmp_path, TEST_CLASSES, **env)


# --------------------------------------------------------------------------------------------------------------
# 1. Streaming sessions: the session's KV is released (scrubbed, handed to another tenant) when a turn ends.
# --------------------------------------------------------------------------------------------------------------

SESSION_KV_RELEASED = r"""
PS = int(os.environ["PS"])
a, kv = allocator(PS)
cache = servers.radix_cache(a)
sess = Session(1 << 20, session_id="s1", streaming=True)
slots = first_turn(a, kv, cache, sess, list(range(1, 11)), 5.0)
OUT["session_holds_kv"] = cache.session.slots["s1"].kv is not None
OUT["owners_after_turn"] = [a.page_owner(int(s) // PS)[0] for s in slots]
a.end_step()
# another tenant's request takes whatever the pool hands out, and its forward writes its own KV there
other = servers.request("g1", list(range(100, 140)), "globex")
with servers.single_rank():
    b2 = servers.prefill(cache, [other])
if b2 is not None:
    write(kv, b2.out_cache_loc, 9.0)
OUT["globex_got_session_slots"] = sorted(set(b2.out_cache_loc.tolist()) & set(slots.tolist())) if b2 is not None else []
OUT["session_kv"] = kv.read(slots)[0, :, 0, 0].tolist()
"""


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_streaming_sessions_kv_is_not_released_to_another_tenant_between_turns(jvm, tmp_path, page_size):
    """README, "What the allocator guarantees": "After a release, pages the request still holds (neither freed
    nor cached by SGLang) are released" -- but SGLang's streaming session (``UnifiedRadixCache``'s embedded
    ``StreamingSession``, ``try_cache_finished_req`` -> ``SessionSlot.save_from_req``) neither frees nor caches a
    finished turn's KV: it keeps it in the session slot for the next turn (the promise: each request reads back
    exactly the KV bytes it wrote, none of another tenant's). The release hook's leftovers release hands the
    session's pages back to the pool: they are scrubbed at the step boundary and the next allocation (another
    tenant's) gets them, while the session slot still names them; the next turn of the session then reads
    globex's bytes (or zeros) as its own history. Expected: the pages stay held while the slot holds them."""
    out = _run(tmp_path, SESSION_KV_RELEASED, PS=str(page_size))
    assert out["session_holds_kv"], out
    assert all(o == "acme" for o in out["owners_after_turn"]), f"session pages released at the turn's end: {out}"
    assert not out["globex_got_session_slots"], f"another tenant was handed the session's slots: {out}"
    assert out["session_kv"] == [5.0] * 10, f"the session's KV was overwritten: {out}"


SESSION_NEXT_TURN = r"""
PS = int(os.environ["PS"])
a, kv = allocator(PS)
cache = servers.radix_cache(a)
sess = Session(1 << 20, session_id="s1", streaming=True)
tokens = list(range(1, 11))
slots = first_turn(a, kv, cache, sess, tokens, 5.0)
a.end_step()
# the session's next turn: SGLang's Session.create_req builds a new Req over the same history plus the new input
turn2 = servers.request("turn2", tokens + [20, 21, 22], "acme", session=sess)
sess._inflight = True
try:
    with servers.single_rank():
        b = servers.prefill(cache, [turn2])
    OUT["admitted"] = b is not None
    OUT["prefix"] = len(turn2.prefix_indices)
    OUT["history"] = kv.read(turn2.prefix_indices.to(torch.int64))[0, :, 0, 0].tolist()
except Exception as e:
    OUT["error"] = f"{type(e).__name__}: {e}"[:600]
"""


def test_a_streaming_sessions_next_turn_prefills_over_its_kept_history(jvm, tmp_path):
    """Drop-in contract (README: "behaves like SGLang's class where upstream succeeds") and the content promise.
    A streaming session's second turn is a new ``Req`` object that SGLang's ``StreamingSession.try_match_prefix``
    restores onto the slot the first turn left (prefix = the first turn's 10 tokens, a partial page at
    page_size 4); upstream's ``alloc_extend`` continues that partial page. With kvshield the prefill step raises
    out of ``alloc_for_extend`` (``KvShieldError: ForeignAccessException: plan row 0 would extend page 3 ...
    which its request does not hold``): the pages were the first turn's Req's (and were released with it,
    test above), and a new Req object never holds them. The whole batch fails (SGLang's scheduler does not
    catch it), on every streaming session's second turn. Expected: the turn is admitted and reads its own
    history (the first turn's bytes, 5.0)."""
    out = _run(tmp_path, SESSION_NEXT_TURN, PS="4")
    assert "error" not in out, f"the session's second turn crashed the prefill step: {out['error']}"
    assert out["admitted"] and out["prefix"] == 10, out
    assert out["history"] == [5.0] * 10, f"the session's second turn does not read its own history: {out}"


# --------------------------------------------------------------------------------------------------------------
# 3. The gateway's tenant does not reach an embedding request's Req (it runs as the default tenant).
# --------------------------------------------------------------------------------------------------------------

EMBEDDING_TENANT = r"""
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
"""


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
    out = _run(tmp_path, EMBEDDING_TENANT, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["sent"] == ["TokenizedGenerateReqInput", "TokenizedEmbeddingReqInput"], out
    assert out["tenants"]["g1"] == "acme", out
    assert out["tenants"]["e1"] == "acme", f"the embedding request's gateway tenant was dropped: {out}"


EMBEDDING_BATCHES = r"""
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
"""

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
    out = _run(tmp_path, EMBEDDING_BATCHES, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["failed"] == [] and out["sealed"] == [True] * 3 and out["aborted"] == {}, out
    assert out["tenants"] == {"e1": "acme", "e2": "globex", "e3": "initech"}, out
    assert out["lora_ids"] == {"e1": "lora-7", "e2": None, "e3": None}, out
    assert out["owners"] == out["tenants"], out


def test_twin_an_embedding_seal_left_out_runs_every_embedding_as_the_default_tenant(jvm, tmp_path):
    out = _run(tmp_path, EMBEDDING_BATCHES, plant=_NO_EMBEDDING_CARRIER, KVSHIELD_TENANT_HEADER="X-Tenant")
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
    out = _run(tmp_path, EMBEDDING_BATCHES, plant=_DIRECT_BATCH, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["tenants"]["e1"] == "acme" and out["owners"] == {"e1": "acme"}, out
    for rid in ("e2", "e3"):
        assert out["aborted"][rid] == (f"kvshield: request {rid} of a BatchTokenizedEmbeddingReqInput was built "
                                       "outside its item's handler: no tenant"), out
    # no tenant source configured: every request is the default tenant's anyway, nothing to refuse
    out = _run(tmp_path, EMBEDDING_BATCHES, plant=_DIRECT_BATCH)
    assert out["aborted"] == {} and set(out["tenants"].values()) == {"default"}, out


UNKNOWN_TYPE = r"""
from kvshield_sglang import hooks
OUT["failed"] = hooks.failed()
"""

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
    out = _run(tmp_path, UNKNOWN_TYPE, plant=plant, KVSHIELD_TENANT_HEADER="X-Tenant")
    failed = [f for f in out["failed"] if "TokenizedScoreReqInput" in f]
    if planted:  # twin: the check left out, the new type's requests would run as the default tenant unnoticed
        assert failed == [], out
        return
    assert [f.split(":")[0] for f in failed] == ["tenant-tokenizer", "tenant-scheduler"], out
    assert "cannot carry the tenant of SGLang's TokenizedScoreReqInput" in failed[0], out
    assert _run(tmp_path, UNKNOWN_TYPE, plant=plant)["failed"] == []  # no tenant configured: nothing to carry


UNSEALABLE = r"""
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
"""

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
    out = _run(tmp_path, UNSEALABLE, plant=_UNSEALABLE_TYPE, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out == {"refused": "kvshield cannot carry the tenant of request u1 (OtherReqInput): refused"}, out
    assert _run(tmp_path, UNSEALABLE, plant=_UNSEALABLE_TYPE) == {"sent": ["OtherReqInput"]}  # no tenant configured


def test_twin_a_tokenizer_that_passes_an_unsealable_request_on_sends_it_unattributed(jvm, tmp_path):
    plant = _UNSEALABLE_TYPE + ("from kvshield_sglang import engine_hooks  # planted bug: unknown types pass unsealed\n"
                                "_stock_seal = engine_hooks._seal_on_create\n"
                                "engine_hooks._seal_on_create = lambda m, c, ch, r: _stock_seal(m, c, ch, "
                                "type(r)(None, None, r.default_tenant))\n")
    out = _run(tmp_path, UNSEALABLE, plant=plant, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out == {"sent": ["OtherReqInput"]}, out


# --------------------------------------------------------------------------------------------------------------
# 4. A tenant quota fails EAGLE's decode allocation (SGLang raises "out of memory": the whole batch fails).
# --------------------------------------------------------------------------------------------------------------

SPEC_QUOTA = r"""
import jpype
from kvshield_sglang import tenants
from sglang.srt.mem_cache import allocation
from sglang.srt.mem_cache.allocation_sizing import page_aligned_decode_alloc_lens, get_alloc_reserve_per_decode
PS, QUOTA = int(os.environ["PS"]), int(os.environ["QUOTA"])
if os.environ.get("PLANTED") == "no-spec-reserve":  # planted bug: the worst case leaves out the speculative reserve
    tenants.decode_reserve_tokens = lambda: 0
servers.publish_server_args(attention_backend="torch_native", page_size=PS, speculative_algorithm="EAGLE",
                            speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)

def assign_on_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, batch_size):
    # SGLang's assign_req_to_token_pool Triton kernel (no GPU here), as plain tensor code
    pt = 0
    for i in range(batch_size):
        s, e = int(start_offset[i]), int(end_offset[i])
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[pt:pt + e - s].to(req_to_token.dtype)
        pt += e - s

allocation.assign_req_to_token_pool_func = assign_on_cpu
a, kv = allocator(PS)
a._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(QUOTA))
cache = servers.radix_cache(a)
req = servers.request("r1", list(range(1, 7)), "acme", max_new_tokens=6)
with servers.single_rank():
    batch = servers.prefill(cache, [req])
OUT["admitted"] = batch is not None and [r.rid for r in batch.reqs]
OUT["aborted"] = req.to_finish is not None and req.to_finish.message
OUT["steps"] = []
# each decode step of the request's life (one accepted token per step: the most steps), sized and allocated as
# eagle_utils.eagle_prepare_for_decode (SGLang's EAGLE worker, spec v2) does
for committed in ([] if req.to_finish is not None else range(6, 6 + 6)):
    req.kv_committed_len = committed
    cur, nxt, need = page_aligned_decode_alloc_lens([req], reserve=get_alloc_reserve_per_decode(), page_size=PS)
    step = {"plan": [cur, nxt, need], "available": a.available_size()}
    try:
        with servers.single_rank():
            allocation.alloc_for_spec_decode(
                cache, cache.req_to_token_pool, reqs=[req], req_pool_indices=batch.req_pool_indices,
                cur_kv_lens=torch.tensor(cur), cur_kv_lens_cpu=torch.tensor(cur, dtype=torch.int32),
                nxt_kv_lens=torch.tensor(nxt), nxt_kv_lens_cpu=torch.tensor(nxt, dtype=torch.int32),
                num_needed_tokens=need, batch=batch)
        step["decode"] = "allocated"
    except Exception as e:
        step["decode"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    OUT["steps"].append(step)
    a.end_step()
"""

# page size, the quota (pages) covering input + max_new_tokens + EAGLE's reserve (8 tokens: 2 x max(3 steps x topk 1,
# 4 draft tokens)), and one it does not cover (yet covering input + max_new_tokens: the defect's case)
_SPEC_CASES = [(4, 5, 3), (1, 20, 12)]


@pytest.mark.parametrize("page_size,covering,short", _SPEC_CASES)
def test_a_tenant_quota_never_fails_an_eagle_decode_allocation(jvm, tmp_path, page_size, covering, short):
    """README, "Tenant quotas": "a per-request outcome, never a failed batch allocation (SGLang's
    ``allocation.py`` raises on ``None``)": ``PrefillAdder.add_one_req`` admits a request only if its quota holds
    its worst case. With EAGLE (spec v2), SGLang allocates ahead of the committed length
    (``eagle_prepare_for_decode``: committed + ``get_alloc_reserve_per_decode()``, page aligned: 6 + 8 -> 16
    tokens = 4 pages at page size 4), beyond input + ``max_new_tokens``. When the admission left the reserve out,
    SGLang's own memory check (``available_size()``) passed, kvshield's pool refused on the quota and SGLang raised
    "Prefill out of memory" out of ``alloc_for_spec_decode``: the whole decode batch failed. Expected: a quota
    holding the reserve admits the request and every decode step of its life allocates; a quota that does not
    aborts that request at admission (a one-token request; SGLang never decodes it), naming its need.
    (As first written this test expected the 3-page quota's request admitted and its 4-page step allocated:
    no quota-keeping pool can do both.)"""
    out = _run(tmp_path, SPEC_QUOTA, PS=str(page_size), QUOTA=str(covering))
    assert out["admitted"] == ["r1"] and out["aborted"] is False, out
    first = 16 if page_size == 4 else 14
    assert out["steps"][0]["plan"] == [[6], [first], first - 6] and out["steps"][0]["available"] >= first - 6, out
    assert [s["decode"] for s in out["steps"]] == ["allocated"] * 6, f"an EAGLE decode step failed on the quota: {out}"

    out = _run(tmp_path, SPEC_QUOTA, PS=str(page_size), QUOTA=str(short))
    assert out["admitted"] == ["r1"] and out["steps"] == [], out
    need = -(-(6 + 6 + 8) // page_size)
    assert out["aborted"] == f"request r1 needs up to {need} KV pages; tenant acme's quota is {short} pages", out


@pytest.mark.parametrize("page_size,covering,short", _SPEC_CASES)
def test_twin_a_worst_case_without_the_spec_reserve_fails_the_decode_batch(jvm, tmp_path, page_size, covering, short):
    out = _run(tmp_path, SPEC_QUOTA, PS=str(page_size), QUOTA=str(short), PLANTED="no-spec-reserve")
    assert out["admitted"] == ["r1"] and out["aborted"] is False, out
    # SGLang's "Prefill out of memory" (page size > 1) or "Out of memory" (page size 1): the whole batch fails
    assert any(s["decode"].startswith("RuntimeError: ") and "out of memory" in s["decode"].lower()
               for s in out["steps"]), out


# --------------------------------------------------------------------------------------------------------------
# 5. Pipeline parallelism's dynamic-chunking profiler leaks the pool (its frees are refused).
# --------------------------------------------------------------------------------------------------------------

PP_PROFILER = r"""
import types
import scheduler_world
from sglang.srt.managers import scheduler_pp_mixin
scheduler_world.cpu_paged_kernels()  # SGLang's paged allocator's two Triton kernels, as CPU code
servers.publish_server_args(attention_backend="torch_native", page_size=4)
a, kv = allocator(4, size=256)
cache = servers.radix_cache(a)
s = servers.scheduler(page_size=4, max_total_num_tokens=256)
s.req_to_token_pool, s.token_to_kv_pool_allocator, s.tree_cache = cache.req_to_token_pool, a, cache
s.pp_group = types.SimpleNamespace(is_first_rank=True)
s.model_config = types.SimpleNamespace(vocab_size=100, is_encoder_decoder=False, hidden_size=4, dtype=torch.float32,
                                       context_len=128)
# only the model and the GPU are replaced: no forward, no device sync, no progress bar (a compat stub here)
s.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
    model_config=s.model_config, get_pp_proxy_topk_size=lambda: None, forward=lambda **k: None))
scheduler_pp_mixin.ForwardBatch = types.SimpleNamespace(init_new=lambda batch, runner, **k: None)
scheduler_pp_mixin.get_device_module = lambda: types.SimpleNamespace(synchronize=lambda: None)
scheduler_pp_mixin.tqdm = lambda it, **k: it
s.device, s.chunked_prefill_size = "cpu", 16
s.ps = types.SimpleNamespace(attn_tp_size=1, attn_cp_size=1, pp_rank=0)
if os.environ.get("FOREIGN"):  # another tenant's request holds KV; a free inside the profiler names its slots
    other = servers.request("g1", list(range(100, 108)), "globex")
    with servers.single_rank():
        foreign = servers.prefill(cache, [other]).out_cache_loc.clone()
    write(kv, foreign, 7.0)
    a.end_step()
    frees = [foreign]
    def forward(**k):
        while frees:
            a.free(frees.pop())
    s.tp_worker.model_runner.forward = forward
OUT["available_before"] = a.available_size()
try:
    with servers.single_rank():
        s.profile_and_init_predictor()  # Scheduler.__init__ runs it with --enable-dynamic-chunking and pp_size > 1
    OUT["profiler"] = "ok"
except Exception as e:  # Scheduler.__init__ catches it, logs a warning and disables dynamic chunking
    OUT["profiler"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
a.end_step()
OUT["available_after"] = a.available_size()
OUT["rejected"] = a.rejected_frees()
if os.environ.get("FOREIGN"):
    OUT["globex"] = [a.page_owner(int(p) // 4)[0] for p in foreign[::4]], kv.read(foreign)[0, :, 0, 0].tolist()
"""


def test_the_pp_dynamic_chunking_profiler_leaves_the_pool_as_it_found_it(jvm, tmp_path):
    """Drop-in contract (README: behaves like SGLang's class where upstream succeeds; availability exact). With
    ``--enable-dynamic-chunking`` and ``pp_size > 1``, ``Scheduler.__init__`` runs
    ``SchedulerPPMixin.profile_and_init_predictor`` before serving: for each sample it builds a ``Req``, runs
    ``ScheduleBatch.prepare_for_extend`` (kvshield's planning hook attributes the pages to that Req) and then
    releases the KV itself with ``token_to_kv_pool_allocator.free(req_to_token[row, :end])`` -- outside any
    hooked release. kvshield refuses each of those frees (counted: "none of them this holder's"), the pages stay
    held by Reqs that no longer exist, and the profiler's later samples fail with "Prefill out of memory"
    (caught by ``Scheduler.__init__``: dynamic chunking silently disabled). With SGLang's own allocator the same
    run profiles every sample and leaves all 256 tokens available; with kvshield the server starts with 16."""
    out = _run(tmp_path, PP_PROFILER, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["available_before"] == 256, out
    assert out["profiler"] == "ok", f"the profiler failed: {out}"
    assert out["available_after"] == 256 and out["rejected"] == 0, f"the profiler's KV leaked: {out}"


def test_twin_without_the_profiler_hook_the_profiler_leaks_the_pool(jvm, tmp_path):
    plant = "plugin.HOOKS = tuple(h for h in plugin.HOOKS if h[0] != 'pp-profiler')  # planted bug: no hook\n"
    out = _run(tmp_path, PP_PROFILER, plant=plant, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["profiler"] != "ok" and out["available_after"] < 256 and out["rejected"] > 0, out


def test_a_free_inside_the_profiler_of_another_holders_pages_is_refused(jvm, tmp_path):
    """Inside the profiler a free is its sample request's release: a slot it does not hold (here another tenant's
    request's, freed from inside the profiled forward) is refused, and that tenant's KV stays its own, byte for
    byte; the profiler still leaves the pool as it found it."""
    out = _run(tmp_path, PP_PROFILER, FOREIGN="1", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["profiler"] == "ok" and out["available_after"] == out["available_before"] == 248, out
    assert out["rejected"] == 2, out  # globex's two pages
    assert out["globex"] == [["globex", "globex"], [7.0] * 8], out
