"""Twelfth attack round: defects in the newest code (tenant tree namespaces through ``Req.extra_key``, streaming
sessions with one live turn, the one-rule-per-state quota worst case and its whole-sequence abort). Each test cites
the promise it checks and failed on the code it was written against because of the defect it names; each twin
plants a defect back and must fail. Each runs in a
subprocess (the plug-in replaces SGLang's classes process-wide) on the real upstream SGLang (``session_world``:
SGLang's ``Req``, ``PrefillAdder``, ``ScheduleBatch``; kvshield's allocator and prefix-cache backend)."""

import pytest
import scenarios
from conftest import TEST_CLASSES

_MARK = "ATTACK12 "

_PRELUDE = r"""
import json, os, torch
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
from kvshield_sglang import disagg, tenants
PLANTED = os.environ.get("PLANTED")
if PLANTED == "shared-prefix-counted":      # the tenant's worst case counts the shared namespace's pages
    tenants.foreign_prefix_pages = lambda req, page_size: 0
elif PLANTED == "decode-queues-skipped":    # the decode quota skips the waiting and retracted queues
    disagg._live_decode_reqs = lambda q: list(q.scheduler.running_batch.reqs) + [d.req for d in q.queue] + [
        d.req for d in q.transfer_queue.queue]
elif PLANTED == "abort-keeps-match":        # the quota abort keeps the whole input's fill ids and match
    plugin._abort_unprefilled = lambda req, why: req.set_finish_with_abort(why)
OUT = {}
def done():
    print("ATTACK12 " + json.dumps(OUT))
"""


def _run(tmp_path, body, **env):
    code = _PRELUDE + "with servers.single_rank():\n" + "\n".join("    " + line for line in body.splitlines()) \
        + "\ndone()\n"
    return scenarios.run_reporting(code, _MARK, tmp_path, TEST_CLASSES, **env)


# --------------------------------------------------------------------------------------------------------------
# 1. Quota: a request whose prefix comes from the operator's declared SHARED namespace is aborted as "over the
#    tenant's quota" although the shared pages are never the tenant's and its own pages fit the quota.
# --------------------------------------------------------------------------------------------------------------
# Promise (plugin._install_tenant_quota docstring / README quota bullet / commit cfbe13a): "One whose whole sequence
# (tenants.request_pages, its prefix too) exceeds the tenant's whole quota is aborted" -- justified in the code by
# "its whole sequence (its prefix too) is the tenant's at once: it can never fit"; and "no legit SGLang path
# refused". With the kvshield backend and KVSHIELD_SHARED_PREFIX_TENANT, a prefix hit in the shared namespace stays
# the SHARED tenant's pages (the request is only a reader): the tenant never owns them. request_pages counts them
# anyway, so a tenant with a small quota is refused (400) on every request that uses the shared system prompt, even
# one that takes a single page of its own. held_pages likewise calls those pages "already counted in its tenant's
# owned pages", which they are not.
# Here: page size 4; shared tenant globex caches a 16-token system prompt (4 pages); acme (quota 3 pages) sends the
# prompt + 1 token, max_new_tokens 2 (positions 16..18: 1 page of its own). Expected: admitted, acme owns 1 page.
# Actual: aborted "needs up to 5 KV pages; tenant acme's quota is 3 pages". A 5-page quota (control) admits it and
# acme then owns 1 page -- proof the 3-page quota held it all along.
SHARED_PREFIX_QUOTA = r"""
import jpype
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
from kvshield_sglang.prefix_cache import KvShieldPrefixCache
w = session_world.World("unified", 4)
rows = ReqToTokenPool(size=16, max_context_len=128, device="cpu", enable_memory_saver=False)
w.cache = KvShieldPrefixCache(CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=w.alloc,
                                              page_size=4, eviction_policy="lru"), shared_tenant="globex")
w.alloc._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(
    int(os.environ["QUOTA"])))
prompt = list(range(300, 316))
w.finish(w.start("globex", prompt))            # the operator's shared system prompt, cached in the shared namespace
OUT["shared_owner_pages"] = w.alloc.tenant_owned_pages("globex")
r = servers.request("acme-1", prompt + [7], "acme", max_new_tokens=2)
b = servers.prefill(w.cache, [r])
OUT["matched"] = len(r.prefix_indices)
OUT["admitted"] = b is not None
OUT["aborted"] = r.to_finish is not None and r.to_finish.message
OUT["acme_owns_after_prefill"] = w.alloc.tenant_owned_pages("acme")
"""


def test_a_shared_namespace_prefix_never_counts_against_the_tenants_whole_quota(jvm, tmp_path):
    out = _run(tmp_path, SHARED_PREFIX_QUOTA, QUOTA="3")
    assert out["matched"] == 16, out  # the shared prompt hit (the shared namespace works)
    assert out["aborted"] is False and out["admitted"], (
        f"quota: acme's request over the SHARED system prompt (16 tokens, pages owned by globex) + 1 token, "
        f"max_new_tokens 2 takes 1 page of its own, yet a 3-page quota aborts it: {out['aborted']!r}")


def test_twin_a_shared_namespace_prefix_counted_against_the_quota_aborts_it(jvm, tmp_path):
    out = _run(tmp_path, SHARED_PREFIX_QUOTA, QUOTA="3", PLANTED="shared-prefix-counted")
    assert "needs up to 5 KV pages" in (out["aborted"] or ""), out  # matched again on its one-token input


def test_control_shared_prefix_request_takes_one_page_of_its_own(jvm, tmp_path):
    out = _run(tmp_path, SHARED_PREFIX_QUOTA, QUOTA="5")
    assert out["matched"] == 16 and out["admitted"] and out["aborted"] is False, out
    assert out["acme_owns_after_prefill"] <= 3, out  # what acme really holds fits the 3-page quota


# --------------------------------------------------------------------------------------------------------------
# 2. A NON-streaming session opened by acme accepts globex's turn: globex's request is built on acme's conversation
#    (acme's prompt and output become globex's input) and runs; acme's next turn then continues from globex's.
# --------------------------------------------------------------------------------------------------------------
# Promise (plugin._install_session_control: "An open binds the session to its tenant (session.kvshield_tenant:
# another tenant's turn is refused at its match)"; README "Streaming sessions"/session-control row; the overall
# "no request ever reads another tenant's KV"). The binding is only enforced in the StreamingSession hook
# (``_streaming(req)``); SGLang's non-streaming ``Session.create_req`` with ``session_params.rid`` naming an earlier
# turn concatenates that turn's ``origin_input_ids + output_ids`` in front of the new request's input. kvshield
# never refuses a request of another tenant naming such a session: globex's Req (stamped globex) carries acme's
# whole conversation as its prompt, is admitted and computes KV over it (globex gets a completion of acme's private
# conversation), and is inserted in the session's request tree.
NONSTREAMING_FOREIGN_TURN = r"""
import asyncio, types
from array import array
from kvshield_sglang import engine_hooks
from sglang.srt.managers.io_struct import OpenSessionReqInput, SessionParams, TokenizedGenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.session.session_controller import SessionController

class Request:
    def __init__(self, headers):
        self.headers = headers

def tokenized(rid, ids, prev=None):
    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=array("q", ids), input_embeds=None, mm_inputs=None, token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=4), return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=False, session_params=SessionParams(id="sa", rid=prev))

w = session_world.World("unified", 4)
controller = SessionController(w.cache)
sched = types.SimpleNamespace(enable_session_radix_cache=False, tree_cache=w.cache, session_controller=controller,
                              ps=types.SimpleNamespace(pp_rank=0, tp_rank=0, attn_cp_rank=0))
tm = servers.tokenizer_manager()
sent = []
async def dispatch(obj):
    sent.append(obj)
tm._async_dispatch_to_scheduler = dispatch
tm._dispatch_to_scheduler = sent.append
tm.auto_create_handle_loop = lambda: None
tm.session_futures = {}
async def _open():
    try:
        await tm.open_session(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id="sa", streaming=False),
                              Request({"X-Tenant": "acme"}))
    except Exception as e:  # the tokenizer waits for the scheduler's answer; what it dispatched is what matters
        OUT.setdefault("open_error", repr(e))
try:
    asyncio.run(asyncio.wait_for(_open(), 2))
except Exception:
    pass
OUT["open_sent"] = len(sent)
for obj in sent:
    Scheduler.open_session(sched, obj)
sess = controller.get("sa")
OUT["bound_to"] = getattr(sess, "kvshield_tenant", None)
SECRET = list(range(4000, 4012))
with engine_hooks.building("acme"):
    t0 = sess.create_req(tokenized("acme-t0", SECRET), None, 100000)
b = w._prefill(t0)
w._write(b, t0, 1, 1)
t0.kv_committed_len = len(SECRET)
t0.output_ids = array("q", [4099])
t0.finished_reason, t0.finished_len = FINISH_LENGTH(length=0), 1
common.release_kv_cache(t0, w.cache)
w.alloc.end_step()
if os.environ.get("PLANTED") == "no-create-check":  # planted bug: Session.create_req without the tenant check
    from sglang.srt.session.session_controller import Session
    Session.create_req = Session.create_req.__wrapped__
with engine_hooks.building("globex"):            # globex names acme's session and acme's turn
    g = sess.create_req(tokenized("globex-g", [9000], prev="acme-t0"), None, 100000)
bg = servers.prefill(w.cache, [g])
OUT["globex_tenant"] = g.kvshield_tenant
OUT["globex_refused"] = g.to_finish is not None
OUT["globex_admitted"] = bg is not None
OUT["globex_prompt_has_acme_tokens"] = [t for t in list(g.origin_input_ids) + list(g.full_untruncated_fill_ids)
                                        + list(getattr(g, "fill_ids", None) or []) if t in SECRET or t == 4099]
OUT["globex_in_session_tree"] = "globex-g" in sess.req_nodes
OUT["globex_on_session"] = g.session is sess
tokenized_replace = tokenized("globex-r", [9001], prev="acme-t0")
tokenized_replace.session_params.replace = True  # SGLang clears the named turn's children for a replace
with engine_hooks.building("globex"):
    r = sess.create_req(tokenized_replace, None, 100000)
OUT["globex_replace_refused"] = r.to_finish is not None
OUT["session_tree_after"] = sorted(sess.req_nodes)
OUT["acme_t0_untouched"] = t0.to_finish is None and list(t0.origin_input_ids) == SECRET
if os.environ.get("PLANTED") == "no-create-check":  # the radix-native check planted away too
    Scheduler._maybe_namespace_elastic_radix_cache = Scheduler._maybe_namespace_elastic_radix_cache.__wrapped__
from sglang.srt.managers.schedule_batch import Req
with engine_hooks.building("globex"):            # a radix-native session request (--enable-session-radix-cache)
    n = Req("globex-n", "", array("q", [9002]), SamplingParams(max_new_tokens=1), session_id="sa")
sched.enable_session_radix_cache, sched.disable_radix_cache = True, True
Scheduler._maybe_namespace_elastic_radix_cache(sched, n)
OUT["radix_native_refused"] = n.to_finish is not None and n.session_id is None
"""


def test_a_non_streaming_session_refuses_another_tenants_turn(jvm, tmp_path):
    out = _run(tmp_path, NONSTREAMING_FOREIGN_TURN, KVSHIELD_TENANT_HEADER="x-tenant")
    assert out["bound_to"] == "acme", out  # the open bound the session to acme (the hook works)
    assert out["globex_refused"] and not out["globex_prompt_has_acme_tokens"], (
        f"isolation: a globex request naming acme's non-streaming session was not refused (admitted: "
        f"{out['globex_admitted']}; its prompt carries acme's conversation {out['globex_prompt_has_acme_tokens']}; "
        f"in acme's session tree: {out['globex_in_session_tree']})")
    assert not out["globex_in_session_tree"] and not out["globex_on_session"], out
    assert out["globex_replace_refused"] and out["session_tree_after"] == ["acme-t0"], (
        f"isolation: globex's replace on acme's session changed acme's session tree: {out['session_tree_after']}")
    assert out["acme_t0_untouched"], out
    assert out["radix_native_refused"], "a globex radix-native request naming acme's session was not refused"


def test_twin_a_session_without_the_creation_check_hands_the_owners_turn_to_another_tenant(jvm, tmp_path):
    out = _run(tmp_path, NONSTREAMING_FOREIGN_TURN, KVSHIELD_TENANT_HEADER="x-tenant", PLANTED="no-create-check")
    assert out["bound_to"] == "acme", out
    assert not out["globex_refused"] and out["globex_prompt_has_acme_tokens"], out  # the content check sees the leak
    assert out["globex_in_session_tree"] and out["session_tree_after"] != ["acme-t0"], out
    assert not out["radix_native_refused"], out

# 3. (PD true-retraction rebootstrap with tenants: moved to test_rebootstrap.py, which recomputes it as its tenant.)

# --------------------------------------------------------------------------------------------------------------
# 4. Decode server quota: a tenant's transferred request waiting in the scheduler's waiting_queue (KV preallocated,
#    not merged into the running batch yet) and a retracted one (in the prealloc queue's retracted_queue, resumed
#    later with its whole worst case) are not counted: a new request is admitted past the tenant's quota.
# --------------------------------------------------------------------------------------------------------------
# Promise (disagg._check_decode_quota: "Raises HandoffError unless req's tenant quota holds its worst case beside
# the worst case of the tenant's requests this decode server already holds (running, in transfer, queued to be
# preallocated): a quota is a per-request outcome, never a decode step whose allocation fails for the whole batch").
# On SGLang's decode server a request whose KV arrived goes ``pop_transferred`` -> ``scheduler.waiting_queue`` and
# stays there while the running batch is full (``get_new_prebuilt_batch`` takes ``max_running_requests - running``);
# a retracted one sits in ``DecodePreallocQueue.retracted_queue`` until ``resume_retracted_reqs``. The check sums
# only ``running_batch.reqs``, ``queue.queue`` and ``transfer_queue.queue``: those requests' growth is missing.
# Here: page size 4, quota 3 pages; d1 (4 tokens, max_new_tokens 4: 2 pages, 1 held) sits WHERE; d2 (the same shape,
# 2 pages) arrives. True worst case 2 + 2 = 4 > 3: d2 must be refused (503). With d1 in the running batch (control)
# it is; in the waiting queue or the retracted queue it is admitted.
DECODE_QUOTA_WHERE = r"""
import jpype, types
from kvshield_sglang import disagg
from kvshield_sglang.errors import HandoffError
w = session_world.World("unified", 4)
w.alloc._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(3))
d1 = servers.request("d1", [1, 2, 3, 4], "acme", max_new_tokens=4)
where = os.environ["WHERE"]
if where != "retracted":
    w._prefill(d1)                                # d1's KV (what the transfer filled): 1 page of acme's
    d1.kv_committed_len = 4
OUT["acme_owns"] = w.alloc.tenant_owned_pages("acme")
d2 = servers.request("d2", [5, 6, 7, 8], "acme", max_new_tokens=4)
sched = types.SimpleNamespace(running_batch=types.SimpleNamespace(reqs=[d1] if where == "running" else []),
                              waiting_queue=[d1] if where == "waiting" else [])
queue = types.SimpleNamespace(scheduler=sched, queue=[types.SimpleNamespace(req=d2)],
                              transfer_queue=types.SimpleNamespace(queue=[]),
                              retracted_queue=[d1] if where == "retracted" else [])
try:
    disagg._check_decode_quota(queue, w.alloc, d2)
    OUT["outcome"] = "admitted"
except HandoffError as e:
    OUT["outcome"] = f"refused: {e}"
"""


@pytest.mark.parametrize("where", ["waiting", "retracted"])
def test_the_decode_quota_counts_a_tenants_waiting_and_retracted_requests(jvm, tmp_path, where):
    out = _run(tmp_path, DECODE_QUOTA_WHERE, WHERE=where)
    assert out["outcome"].startswith("refused"), (
        f"decode quota: with acme's d1 (worst case 2 pages) in the decode scheduler's {where} queue, d2 (2 pages) is "
        f"{out['outcome']} under a 3-page quota (acme owns {out['acme_owns']}): both decode past the quota")


@pytest.mark.parametrize("where", ["waiting", "retracted"])
def test_twin_a_decode_quota_skipping_those_queues_admits_past_the_quota(jvm, tmp_path, where):
    out = _run(tmp_path, DECODE_QUOTA_WHERE, WHERE=where, PLANTED="decode-queues-skipped")
    assert out["outcome"] == "admitted", out


def test_control_the_decode_quota_counts_a_running_request(jvm, tmp_path):
    out = _run(tmp_path, DECODE_QUOTA_WHERE, WHERE="running")
    assert out["outcome"].startswith("refused"), out


# --------------------------------------------------------------------------------------------------------------
# 5. Quota: one request whose PROMPT alone exceeds its tenant's quota kills the scheduler ("Prefill out of memory").
# --------------------------------------------------------------------------------------------------------------
# Promise (plugin._install_tenant_quota: "a tenant quota is a per-request outcome, never a failed batch allocation
# (SGLang's allocation.py raises on None)"; "One whose whole sequence ... exceeds the tenant's whole quota is aborted
# (SGLang's set_finish_with_abort: 400), which leaves a one-token request"; README "fail closed ... pool unchanged").
# Upstream calls set_finish_with_abort BEFORE the request's match (handle_generate_request), so its fill_ids are the
# one token. kvshield calls it inside PrefillAdder.add_one_req, AFTER ``init_next_round_input`` computed fill_ids /
# extend_input_len from the whole prompt: the quota check then counts the aborted request as 1 token (1 page) and
# admits it, but SGLang's prepare_for_extend allocates its stale fill_ids -- the whole prompt. The tenant's quota
# refuses that allocation, alloc_for_extend returns None and SGLang raises RuntimeError("Prefill out of memory") out
# of the scheduler loop: every tenant's requests die with the rank.
# Here: page size 4, quota 4 pages (16 tokens); acme sends a 17-token prompt, max_new_tokens 4.
# Expected: aborted (400), no crash, nothing allocated past the quota. Actual: RuntimeError "Prefill out of memory ...
# Try to allocate 17 tokens" (48 tokens free in the pool).
ABORT_AFTER_MATCH = r"""
import jpype
w = session_world.World("unified", 4)
w.alloc._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(4))
r = servers.request("acme-big", list(range(300, 300 + int(os.environ.get("PROMPT", "17")))), "acme",
                    max_new_tokens=int(os.environ.get("MAXNEW", "4")))
try:
    b = servers.prefill(w.cache, [r])
    OUT["outcome"] = "admitted" if b is not None else "waits"
    OUT["extend_tokens"] = None if b is None else int(b.extend_num_tokens)
except Exception as e:
    OUT["outcome"] = f"crash {type(e).__name__}: {str(e)[:200]}"
OUT["aborted"] = r.to_finish is not None and r.to_finish.message
OUT["owned_after"] = w.alloc.tenant_owned_pages("acme")
"""


def test_a_prompt_over_the_tenants_quota_is_aborted_without_killing_the_scheduler(jvm, tmp_path):
    out = _run(tmp_path, ABORT_AFTER_MATCH)
    assert out["aborted"], out
    assert not out["outcome"].startswith("crash"), (
        f"quota: acme's 17-token prompt over its 4-page quota was aborted ({out['aborted']!r}) but still admitted with "
        f"its whole prompt as fill_ids; the prefill raised out of the scheduler loop: {out['outcome']}")
    assert out["owned_after"] <= 4, out


def test_twin_a_quota_abort_keeping_the_whole_inputs_match_kills_the_scheduler(jvm, tmp_path):
    out = _run(tmp_path, ABORT_AFTER_MATCH, PLANTED="abort-keeps-match")
    assert out["aborted"] and out["outcome"].startswith("crash RuntimeError: Prefill out of memory"), out


def test_control_a_prompt_within_the_quota_whose_sequence_exceeds_it_is_aborted_cleanly(jvm, tmp_path):
    """12-token prompt (3 pages) + max_new_tokens 8: 5 pages > 4, aborted; its stale 12-token prefill fits the quota,
    so nothing crashes -- the crash needs the prompt itself over the quota."""
    out = _run(tmp_path, ABORT_AFTER_MATCH, PROMPT="12", MAXNEW="8")
    assert out["aborted"] and out["outcome"] == "admitted" and out["owned_after"] <= 4, out
