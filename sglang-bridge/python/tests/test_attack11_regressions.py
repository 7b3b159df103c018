"""Eleventh attack round: defects in the newest fixes (streaming sessions as one pool holder, tenant carriers, the
quota's speculative reserve, the PP profiler hook). Each test states the promise it checks (README / DESIGN-NOTES /
docstring) and failed on the code it was written against, because of the defect it names; each twin plants a
defect back and must fail. Each runs in a subprocess
(the plug-in replaces SGLang's classes process-wide) on the real SGLang: ``session_world.World`` builds SGLang's own
``MHATokenToKVPool``-like pool, kvshield's allocator, ``UnifiedRadixCache`` (embedded ``StreamingSession``) or
SGLang's ``StreamingSession`` wrapper, SGLang's ``Session``, ``Req``, ``PrefillAdder`` and ``ScheduleBatch``; the
oracle reads back the bytes in the KV tensors."""

import pytest
import scenarios
from conftest import TEST_CLASSES

_MARK = "ATTACK11 "

_PRELUDE = r"""
import json, os, torch
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
OUT = {}
def done():
    print("ATTACK11 " + json.dumps(OUT))
"""


def _run(tmp_path, body, **env):
    code = _PRELUDE + "with servers.single_rank():\n" + "\n".join("    " + line for line in body.splitlines()) \
        + "\ndone()\n"
    return scenarios.run_reporting(code, _MARK, tmp_path, TEST_CLASSES, **env)


# --------------------------------------------------------------------------------------------------------------
# 1. A streaming session released while one of its turns still runs hands that turn's KV to another tenant.
# --------------------------------------------------------------------------------------------------------------
# Promise (README "Streaming sessions", DESIGN-NOTES 37, plugin._install_streaming_sessions): "a session is one
# holder of one tenant; its turns serve as it"; "no request ever reads another tenant's KV"; a free of pages a
# request does not hold is refused. Because every turn is the *same* pool holder as the session, a release of the
# session (its close, or another turn's mid-turn abort) frees and releases (leftovers) the pages a still-running
# turn is reading and extending: they are scrubbed and handed to another tenant while that turn runs on them.
#
# How two turns of one session get to be live at once, with SGLang's own code: turn T1 is running; the same client
# sends T2 on the session; ``Session.create_req`` refuses it ("Streaming session already has an active request":
# ``to_finish`` set, ``session`` kept); at T2's match kvshield's ``try_match_prefix`` hands it to SGLang's
# ``find_active_slot``, which "detaches" the pre-aborted request by calling ``session.abort_req()`` -- clearing the
# session's in-flight flag although T1 still runs (kvshield only avoids that call for a *foreign* tenant's request).
# From then on ``SessionController._close`` sees no in-flight turn and releases the session at once (or a third
# turn T3 is accepted and its mid-turn abort runs ``release_session`` inside its release, as the session).
# Either way the session's leftovers release -- which includes every page T1 allocated, because T1 *is* the session
# to the pool -- and tenant globex's next request gets them. T1 (tenant acme) then reads globex's KV.
SESSION_RELEASED_UNDER_LIVE_TURN = r"""
w = session_world.World(os.environ["CACHE"], int(os.environ["PS"]))
PS = w.page_size
s = w.open("sa", "acme")
w.turn("sa", range(1, 8))                       # T0 finished: the slot keeps its 7 tokens
tokens1 = s.tokens + [11, 12, 13]
t1 = servers.request("sa-t1", tokens1, "acme", session=s.session)
s.session._inflight = True                      # Session.create_req, for the running turn T1
b1 = w._prefill(t1)
w._write(b1, t1, s.tenant_code, s.code)
t1.kv_committed_len = len(tokens1)
row = t1.req_pool_idx
hist = w.cache.req_to_token_pool.req_to_token[row, :len(tokens1)].to(torch.int64).clone()  # what T1 attends to
# T2: the same client's request on the session while T1 runs, as Session.create_req builds it (refused, session kept)
t2 = servers.request("sa-t2", s.tokens + [20], "acme", session=s.session)
t2.set_finish_with_abort("Streaming session already has an active request.")
t2.init_next_round_input(w.cache)               # SGLang matches every queued request, aborted ones too
OUT["inflight_after_refused_request"] = bool(s.session._inflight)
if os.environ["HOW"] == "close":
    # CloseSessionReqInput -> SessionController._close: no in-flight turn any more -> release_session now
    w.cache.release_session("sa")
else:
    # T3, accepted by Session.create_req (not in flight), matched onto the same slot, prefilled, then aborted
    t3 = servers.request("sa-t3", s.tokens + [30], "acme", session=s.session)
    s.session._inflight = True
    b3 = w._prefill(t3)
    w._write(b3, t3, s.tenant_code, s.code)
    t3.kv_committed_len = int(b3.seq_lens_cpu[0])  # what its prefill committed (1 token if refused at its match)
    t3.finished_reason = FINISH_ABORT()
    common.release_kv_cache(t3, w.cache)        # mid-turn abort: release_session inside T3's release
w.alloc.end_step()
for i in range(12):                             # globex's requests take all the pool has, each writing its KV
    if w.alloc.available_size() + w.cache.evictable_size() < 8 + 4 * PS:
        break
    w.start("globex", list(range(5000 + 100 * i, 5000 + 100 * i + 8)))
got = w.kv.read(hist)[0, :, 0, 0].tolist()      # T1 still runs: the KV it reads as its own history
OUT["t1_reads"] = got
OUT["foreign_positions"] = [i for i, v in enumerate(got) if int(v) // 10000 != s.tenant_code]
OUT["owners"] = [w.alloc.page_owner(int(x) // PS)[0] for x in hist]
"""


@pytest.mark.parametrize("cache,page_size,how", [("unified", 4, "close"), ("unified", 1, "other-turn-abort"),
                                                  ("chunk", 4, "close")])
def test_a_session_released_while_its_turn_runs_never_hands_that_turns_kv_to_another_tenant(
        jvm, tmp_path, cache, page_size, how):
    out = _run(tmp_path, SESSION_RELEASED_UNDER_LIVE_TURN, CACHE=cache, PS=str(page_size), HOW=how)
    assert not out["foreign_positions"], (
        f"isolation: acme's running streaming turn reads another tenant's KV at history positions "
        f"{out['foreign_positions']} (values {out['t1_reads']}; page owners now {out['owners']})")



# 1b. The same, with no SGLang quirk beyond its normal paths: a running turn T1 is retracted under memory pressure
# (``retract_decode`` -> ``release_req`` -> ``release_kv_cache(is_insert=False)``: the streaming session saves T1's
# KV in its slot and ``finish_req`` clears the in-flight flag), so the client's next turn T2 is accepted and runs
# on the slot; the retracted T1 is scheduled again (matched onto the slot, re-prefilled) and its client aborts it
# mid-turn: its release runs ``release_session`` and the leftovers release as the session -- T2's pages too.
RETRACTED_TURN_ABORT_UNDER_LIVE_TURN = r"""
w = session_world.World(os.environ["CACHE"], int(os.environ["PS"]))
PS = w.page_size
s = w.open("sa", "acme")
w.turn("sa", range(1, 8))
tokens1 = s.tokens + [11, 12, 13]
t1 = servers.request("sa-t1", tokens1, "acme", session=s.session)
s.session._inflight = True
b1 = w._prefill(t1)
w._write(b1, t1, s.tenant_code, s.code)
t1.kv_committed_len = len(tokens1)
common.release_kv_cache(t1, w.cache, is_insert=False)   # retracted (release_req), back to the waiting queue
t1.reset_for_retract()
OUT["inflight_after_retract"] = bool(s.session._inflight)
w.alloc.end_step()
tokens2 = tokens1 + [40, 41]                            # Session.create_req accepts T2, built on T1 (req_nodes)
t2 = servers.request("sa-t2", tokens2, "acme", session=s.session)
s.session._inflight = True
b2 = w._prefill(t2)
w._write(b2, t2, s.tenant_code, s.code)
t2.kv_committed_len = len(tokens2)
hist = w.cache.req_to_token_pool.req_to_token[t2.req_pool_idx, :len(tokens2)].to(torch.int64).clone()
b1 = w._prefill(t1)                                     # the retracted T1 scheduled again
w._write(b1, t1, s.tenant_code, s.code)
t1.kv_committed_len = int(b1.seq_lens_cpu[0])           # what its prefill committed (1 token if refused at its match)
t1.finished_reason = FINISH_ABORT()                     # its client aborts it mid-turn
common.release_kv_cache(t1, w.cache)
w.alloc.end_step()
for i in range(12):                                     # globex's requests take what the pool has
    if w.alloc.available_size() + w.cache.evictable_size() < 8 + 4 * PS:
        break
    w.start("globex", list(range(5000 + 100 * i, 5000 + 100 * i + 8)))
got = w.kv.read(hist)[0, :, 0, 0].tolist()              # T2 still runs: its history
OUT["t2_reads"] = got
OUT["foreign_positions"] = [i for i, v in enumerate(got) if int(v) // 10000 != s.tenant_code]
OUT["owners"] = [w.alloc.page_owner(int(x) // PS)[0] for x in hist]
"""


@pytest.mark.parametrize("cache,page_size", [("unified", 4), ("unified", 1)])
def test_a_retracted_turns_abort_never_hands_the_running_turns_kv_to_another_tenant(jvm, tmp_path, cache, page_size):
    out = _run(tmp_path, RETRACTED_TURN_ABORT_UNDER_LIVE_TURN, CACHE=cache, PS=str(page_size))
    assert not out["foreign_positions"], (
        f"isolation: acme's running streaming turn T2 reads another tenant's KV at history positions "
        f"{out['foreign_positions']} after the retracted turn T1's abort released the session (values "
        f"{out['t2_reads']}; page owners now {out['owners']})")

# --------------------------------------------------------------------------------------------------------------
# 2. A turn restored onto the session's slot, then aborted before its prefill, gives the session's req_to_token row
#    away: the session's next turn reads another tenant's KV as its history.
# --------------------------------------------------------------------------------------------------------------
# Promise (README "Streaming sessions": "the next turn reads and extends it [the session's KV]"; a request SGLang
# detaches from the session "stops serving as the session"; "no request ever reads another tenant's KV"). A turn is
# matched (``StreamingSession.restore_to_req`` puts the slot's ``req_pool_idx`` and ``kv`` on it), is not admitted
# this round, and is aborted while it waits (client disconnect: ``to_finish`` set). At its next match kvshield's
# hook sees ``to_finish`` and only calls ``leave_session``; SGLang's ``find_active_slot`` detaches it, but the Req
# still carries the slot's row. SGLang prefills it anyway (``ReqToTokenPool.alloc`` reuses a set ``req_pool_idx``),
# writes it into the session's row, and its release returns that row to ``free_slots``
# (``req_to_token_pool.free(req)``) while the session's slot still names it. Tenant globex's next request gets the
# row; the session's next turn (acme) restores the slot and reads ``req_to_token[row, :prefix]`` -- globex's pages,
# globex's KV (the pool reports them globex's). Nothing in the hook clears the detached Req's slot state.
DETACHED_TURN_GIVES_ROW_AWAY = r"""
w = session_world.World(os.environ["CACHE"], int(os.environ["PS"]))
PS = w.page_size
s = w.open("sa", "acme")
w.turn("sa", range(1, 8))                       # T0 finished: the slot keeps its 7 tokens in its row
row = w._slots()["sa"].req_pool_idx
td = servers.request("sa-td", s.tokens + [3], "acme", session=s.session)
s.session._inflight = True                      # Session.create_req
td.init_next_round_input(w.cache)               # matched: restored onto the slot (not admitted this round)
td.set_finish_with_abort("client disconnected while queued")
b = w._prefill(td)                              # next round: matched again (SGLang detaches it), admitted, prefilled
w._write(b, td, s.tenant_code, 8)
td.kv_committed_len = len(td.origin_input_ids)
td.finished_reason = FINISH_ABORT()
common.release_kv_cache(td, w.cache)            # the aborted request finishes and is released
w.alloc.end_step()
OUT["row_free_while_slot_names_it"] = row in w.cache.req_to_token_pool.free_slots
g = w.start("globex", list(range(5000, 5008)))  # globex's request, live, writes its KV
OUT["globex_row"] = g.req_pool_idx
t2 = servers.request("sa-t2", s.tokens + [50], "acme", session=s.session)
s.session._inflight = True
t2.init_next_round_input(w.cache)               # the session's next turn restores the slot: its history
pre = t2.prefix_indices.to(torch.int64)
got = w.kv.read(pre)[0, :, 0, 0].tolist()
OUT["t2_reads"] = got
OUT["foreign_positions"] = [i for i, v in enumerate(got) if int(v) // 10000 != s.tenant_code]
OUT["owners"] = [w.alloc.page_owner(int(x) // PS)[0] for x in pre]
"""


@pytest.mark.parametrize("cache,page_size", [("unified", 4), ("chunk", 1)])
def test_a_turn_aborted_after_its_match_never_gives_the_sessions_history_to_another_tenant(
        jvm, tmp_path, cache, page_size):
    out = _run(tmp_path, DETACHED_TURN_GIVES_ROW_AWAY, CACHE=cache, PS=str(page_size))
    assert not out["foreign_positions"], (
        f"isolation: acme's next streaming turn reads another tenant's KV as its history at positions "
        f"{out['foreign_positions']} (values {out['t2_reads']}; page owners {out['owners']}; the session's row was "
        f"freed while its slot named it: {out['row_free_while_slot_names_it']}, globex's request got row "
        f"{out['globex_row']})")


# --------------------------------------------------------------------------------------------------------------
# 3. SGLang's default tree cache (UnifiedRadixCache, accepted at start) hands one tenant's cached prefix to another.
# --------------------------------------------------------------------------------------------------------------
# Promise (README: "no request ever reads another tenant's KV"; "Regulated tenants never share prefix pages";
# DESIGN-NOTES 15 / sglang-bridge README: a stock radix-cache prefix hit is "an earlier same-tenant request's").
# The tenant travels sealed in ``extra_key`` and the original value is put back before SGLang sees the request, so
# the stock tree's namespace carries no tenant: a globex request whose prompt starts like a finished acme request's
# matches acme's cached pages (the pool reports them acme's) and reads acme's KV as its own prefix. The same holds
# for a streaming session's first turn (its prefix is inserted into the tree) -- e.g. a session id reopened by
# another tenant with the same opening. Only the disaggregation send path checks a page's tenant; start-up refuses
# other trees (C++, FlexKV, other backends) but accepts this one, the default.
STOCK_TREE_CROSS_TENANT_HIT = r"""
w = session_world.World("unified", int(os.environ["PS"]))
PS = w.page_size
a = w.start("acme", list(range(100, 112)))      # acme's request, written, finished: the tree keeps its pages
w.finish(a)
g = servers.request("g1", list(range(100, 112)) + [7], "globex")
g.init_next_round_input(w.cache)                # globex's request with the same opening, matched
pre = g.prefix_indices.to(torch.int64)
got = w.kv.read(pre)[0, :, 0, 0].tolist()
OUT["matched"] = len(pre)
OUT["reads"] = got
OUT["foreign_positions"] = [i for i, v in enumerate(got) if int(v) // 10000 != 2]
OUT["owners"] = sorted({str(w.alloc.page_owner(int(x) // PS)[0]) for x in pre})
"""


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_default_tree_cache_never_serves_one_tenants_prefix_to_another(jvm, tmp_path, page_size):
    out = _run(tmp_path, STOCK_TREE_CROSS_TENANT_HIT, PS=str(page_size))
    assert not out["foreign_positions"], (
        f"isolation: globex's request matched {out['matched']} cached tokens of acme's and reads acme's KV at "
        f"positions {out['foreign_positions']} (values {out['reads'][:6]}...; page owners {out['owners']})")



# --------------------------------------------------------------------------------------------------------------
# 4. Quota: a streaming session's next turn is never admitted when the session's history ends in a partial page,
#    although its whole worst case fits the tenant's quota.
# --------------------------------------------------------------------------------------------------------------
# Promise (plugin._install_tenant_quota, tenants.worst_case_pages/request_pages, README quota bullet): "A request is
# admitted only if its tenant's quota holds its worst case (its new pages up to max_new_tokens) beside ..."; one that
# needs more than the whole quota is aborted (400) -- it never waits forever. ``worst_case_pages(grown=False)``
# subtracts ``len(prefix_indices) // page_size`` whole pages from the request's total, while the tenant's owned pages
# (``tenant_owned_pages``) already include the history's partial last page: that page is counted twice. A session
# turn's prefix comes from the slot, unaligned (here 7 tokens at page size 4: pages 0 and 1 held). Its next turn (1
# new token, max_new_tokens 4: positions 0..11, 3 pages in all, 1 of them new) under a 3-page quota: need = 3 - 1 = 2
# new pages, headroom = 3 - 2 owned = 1 -> it waits; it is not aborted (2 <= 3) and nothing of the tenant's will
# ever free a page (the session holds them until the turn runs): the turn waits forever. A page-aligned history (8
# tokens, 4-page quota), and the same 7-token history with a 4-page quota, are admitted (checked, both pass).
SESSION_TURN_QUOTA = r"""
import jpype
from kvshield_sglang import tenants
if os.environ.get("PLANTED") == "whole-prefix-pages":  # planted bug: a partial prefix page is not counted as held
    tenants.held_pages = lambda req, ps: len(req.prefix_indices) // ps
w = session_world.World("unified", 4)
w.alloc._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(
    int(os.environ["QUOTA"])))
s = w.open("sa", "acme")
first = list(range(1, 1 + int(os.environ["HISTORY"])))
w.turn("sa", first)                            # the first turn: admitted, finished, its KV kept by the session
OUT["owned_after_first_turn"] = w.alloc.tenant_owned_pages("acme")
t2 = servers.request("sa-t2", s.tokens + [50], "acme", session=s.session)   # max_new_tokens 4
s.session._inflight = True
admitted = []
for attempt in range(3):                       # three scheduler passes; nothing else runs
    b = servers.prefill(w.cache, [t2])
    admitted.append(b is not None)
    if b is not None:
        break
    w.alloc.end_step()
OUT["admitted"] = admitted
OUT["aborted"] = t2.to_finish is not None and t2.to_finish.message
OUT["worst_case_total_pages"] = -(-(len(s.tokens) + 1 + 4) // 4)
"""


@pytest.mark.parametrize("history,quota", [(7, 3)])  # (an 8-token history with a 4-page quota is admitted: passes)
def test_a_session_turn_whose_worst_case_fits_the_quota_is_admitted(jvm, tmp_path, history, quota):
    out = _run(tmp_path, SESSION_TURN_QUOTA, HISTORY=str(history), QUOTA=str(quota))
    assert out["worst_case_total_pages"] <= quota  # the turn's whole life fits the quota
    assert any(out["admitted"]) or out["aborted"], (
        f"quota: a session turn whose whole worst case ({out['worst_case_total_pages']} pages, {history}-token history)"
        f" fits the {quota}-page quota is never admitted nor aborted: it waits forever (passes: {out['admitted']}; "
        f"acme owns {out['owned_after_first_turn']} pages)")


@pytest.mark.parametrize("history,quota", [(7, 4), (8, 4)])
def test_control_a_session_turn_with_room_in_the_quota_is_admitted(jvm, tmp_path, history, quota):
    out = _run(tmp_path, SESSION_TURN_QUOTA, HISTORY=str(history), QUOTA=str(quota))
    assert out["admitted"] == [True] and out["aborted"] is False, out


def test_a_session_turn_whose_whole_sequence_exceeds_the_quota_is_aborted(jvm, tmp_path):
    """The same class: a turn's whole sequence (its history pages too) is the tenant's at once. An 8-token history
    (2 pages) and a turn of 1 + 4 new tokens: 4 pages in all, over a 3-page quota: it can never run, so it is
    aborted (400) naming its need -- it used to wait forever (1 new page would fit the quota, never the headroom)."""
    out = _run(tmp_path, SESSION_TURN_QUOTA, HISTORY="8", QUOTA="3")
    assert out["worst_case_total_pages"] == 4, out
    assert out["aborted"] == "request sa-t2 needs up to 4 KV pages; tenant acme's quota is 3 pages", out


def test_twin_a_partial_prefix_page_counted_twice_never_admits_the_turn(jvm, tmp_path):
    out = _run(tmp_path, SESSION_TURN_QUOTA, HISTORY="7", QUOTA="3", PLANTED="whole-prefix-pages")
    assert out["admitted"] == [False] * 3 and out["aborted"] is False, out



# --------------------------------------------------------------------------------------------------------------
# 5. Another tenant's CloseSessionReqInput closes a tenant's streaming session: its kept KV is freed (as the
#    session's) on a request that carries no tenant, and the owner's next turn is refused.
# --------------------------------------------------------------------------------------------------------------
# Promise (README "Streaming sessions": "Each session is one pool holder, of the tenant of its first turn ... A
# request of another tenant naming the session is aborted and detached from it"; engine_hooks: "While tenants are
# configured, nothing falls to the default tenant for want of a carrier" / fail closed). The session control requests
# (``TokenizerManager.close_session(obj, request)``, which gets the gateway's headers) are not hooked:
# ``CloseSessionReqInput`` carries only ``session_id`` and SGLang's ``Scheduler.close_session`` ->
# ``SessionController._close`` -> ``release_session`` runs for whoever sent it. kvshield's ``release_session`` hook
# then frees the session's holds as the session -- a globex request releases acme's KV, attributed to acme, with no
# check. (Open has the same gap: the owner is whoever's first turn comes first.)
FOREIGN_CLOSE = r"""
import asyncio, types
from sglang.srt.managers.io_struct import CloseSessionReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.session.session_controller import SessionController

class Request:  # FastAPI's request as the HTTP entry points pass it: headers only matter here
    def __init__(self, headers):
        self.headers = headers

w = session_world.World("unified", 4)
s = w.open("sa", "acme")
w.turn("sa", range(1, 8))                       # acme's session keeps 7 tokens of KV
controller = SessionController(w.cache)
controller.sessions["sa"] = s.session
kept = w._kept_slots(s).clone()
tm = servers.tokenizer_manager()
sent = []
async def dispatch(obj):
    sent.append(obj)
tm._async_dispatch_to_scheduler = dispatch
asyncio.run(tm.close_session(CloseSessionReqInput(session_id="sa"), Request({"X-Tenant": "globex"})))
OUT["close_reached_scheduler"] = len(sent)
sched = types.SimpleNamespace(enable_session_radix_cache=False, tree_cache=w.cache, session_controller=controller)
for obj in sent:
    Scheduler.close_session(sched, obj)          # SGLang's scheduler handler for the globex request
w.alloc.end_step()
OUT["session_still_open"] = "sa" in controller.sessions
OUT["acme_kv_still_held"] = [w.alloc.page_owner(int(x) // 4)[0] for x in kept]
"""


def test_another_tenants_close_request_never_releases_a_tenants_streaming_session(jvm, tmp_path):
    out = _run(tmp_path, FOREIGN_CLOSE, KVSHIELD_TENANT_HEADER="x-tenant")
    assert out["session_still_open"] and all(o == "acme" for o in out["acme_kv_still_held"]), (
        f"isolation: a globex CloseSessionReqInput closed acme's streaming session (reached the scheduler: "
        f"{out['close_reached_scheduler']}; session open: {out['session_still_open']}; owners of acme's kept KV now "
        f"{out['acme_kv_still_held']})")



# --------------------------------------------------------------------------------------------------------------
# 6. Quota: a running request's next decode page is not counted, so the tenant's decode batch fails to allocate.
# --------------------------------------------------------------------------------------------------------------
# Promise (plugin._install_tenant_quota: "a tenant quota is a per-request outcome, never a failed batch allocation
# (SGLang's allocation.py raises on None)"; attack9's "a tenant quota never fails an EAGLE decode allocation";
# tenants.worst_case_pages: "a running request holds its sequence so far"). After its prefill a request has one output
# token whose KV is not allocated yet (SGLang allocates it at the next decode step: ``kv_allocated_len`` == input),
# but ``worst_case_pages(grown=True)`` counts ``len(origin_input_ids) + len(output_ids)`` as held: at a page boundary
# the request's next page is counted as held, its remaining worst case is one page short. The same for a running
# request aborted by its client (``Scheduler.abort_request`` sets ``to_finish``: "the request will still run one
# decode forward pass"), which ``request_pages`` now counts as its input only. Either way a second request of the
# tenant is admitted into a headroom that is not there, and the next decode batch's ``alloc_for_decode`` gets None
# from the pool (the tenant is at its quota) and raises "Decode out of memory": the scheduler loop dies.
# Here: quota 3 pages (page size 4); R = 4 tokens + max_new_tokens 4 (2 pages), running after its prefill; N = the
# same shape. True worst case 4 pages > 3: N must wait. A 4-page quota (the control case) admits N and decodes both.
RUNNING_DECODE_PAGE = r"""
import jpype, types
from fakes import MHAPool
import sglang.srt.mem_cache.allocator.paged as paged
from sglang.srt.mem_cache import allocation
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from kvshield_sglang import tenants
if os.environ.get("PLANTED") == "sampled-token-held":  # planted bug: the sampled token's KV counted as held
    tenants.held_pages = lambda req, ps: -(-(len(req.prefix_indices) if req.kv is None else max(
        len(req.origin_input_ids) + len(req.output_ids), req.kv.kv_allocated_len)) // ps)
if os.environ.get("PLANTED") == "abort-prefill-only":  # planted bug: an aborted request never decodes again
    _pages = tenants.request_pages
    tenants.request_pages = lambda req, ps: (-(-len(req.origin_input_ids) // ps) if req.to_finish is not None
                                             else _pages(req, ps))
servers.publish_server_args(attention_backend="torch_native")
PS = 4
kv = MHAPool(64, PS)
a = paged.PagedTokenToKVPoolAllocator(64, PS, torch.float32, "cpu", kv, False)
a._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(
    int(os.environ["QUOTA"])))
cache = servers.radix_cache(a)
r = servers.request("r", [1, 2, 3, 4], "acme", max_new_tokens=4)
br = servers.prefill(cache, [r])
r.output_ids, r.kv_committed_len = [7], 4       # the prefill's forward sampled its first token (KV not allocated)
a.end_step()
if os.environ["ABORT"] == "1":
    r.to_finish = FINISH_ABORT()                # Scheduler.abort_request on a running request
n = servers.request("n", [10, 11, 12, 13], "acme", max_new_tokens=4)
bn = servers.prefill(cache, [n], running=br)    # the next admission pass, R in the running batch
OUT["n_admitted"] = bn is not None
reqs = [r]
if bn is not None:
    n.output_ids, n.kv_committed_len = [8], 4
    a.end_step()
    reqs = [r, n]
b = ScheduleBatch.init_new(reqs, cache.req_to_token_pool, a, cache,
                           types.SimpleNamespace(vocab_size=100, is_encoder_decoder=False), False,
                           SpeculativeAlgorithm.from_string(None))
b.seq_lens = torch.tensor([4] * len(reqs))      # prepare_for_decode's view: KV for position 4 is allocated now
b.seq_lens_cpu = torch.tensor([4] * len(reqs))
b.req_pool_indices = torch.tensor([x.req_pool_idx for x in reqs])
try:
    allocation.alloc_for_decode(b, 1)           # the decode step (the aborted R runs it too)
    OUT["decode"] = "allocated"
except Exception as e:
    OUT["decode"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"
OUT["owned"] = a.tenant_owned_pages("acme")
"""


@pytest.mark.parametrize("aborted", [False, True])
@pytest.mark.parametrize("quota", [3])  # (a 4-page quota admits N and decodes both: checked, passes)
def test_a_tenant_quota_never_fails_the_decode_step_of_its_running_requests(jvm, tmp_path, quota, aborted):
    out = _run(tmp_path, RUNNING_DECODE_PAGE, QUOTA=str(quota), ABORT="1" if aborted else "0")
    assert out["decode"] == "allocated", (
        f"quota: with a {quota}-page quota the second request was admitted ({out['n_admitted']}) and the decode step "
        f"of the tenant's running requests failed: {out['decode']} (acme owns {out['owned']} pages)")
    assert out["n_admitted"] is False, out  # R's worst case (2 pages, 1 held) and N's (2) exceed 3 pages


@pytest.mark.parametrize("aborted", [False, True])
def test_control_a_quota_holding_both_worst_cases_admits_and_decodes_both(jvm, tmp_path, aborted):
    out = _run(tmp_path, RUNNING_DECODE_PAGE, QUOTA="4", ABORT="1" if aborted else "0")
    assert out["n_admitted"] is True and out["decode"] == "allocated" and out["owned"] == 4, out


@pytest.mark.parametrize("planted,aborted", [("sampled-token-held", False), ("sampled-token-held", True),
                                             ("abort-prefill-only", True)])
def test_twin_a_running_worst_case_short_of_its_next_decode_page_fails_the_decode_step(jvm, tmp_path, planted,
                                                                                     aborted):
    out = _run(tmp_path, RUNNING_DECODE_PAGE, QUOTA="3", ABORT="1" if aborted else "0", PLANTED=planted)
    assert out["n_admitted"] is True and out["decode"].startswith("RuntimeError: Decode out of memory"), out



# --------------------------------------------------------------------------------------------------------------
# 7. The foreign request kvshield refuses at its match is still matched on the session's history and, in the same
#    scheduler pass, admitted and prefilled over the owner's KV.
# --------------------------------------------------------------------------------------------------------------
# Promise (README "Streaming sessions": "A request of another tenant naming the session is aborted and detached from
# it at its match, before it reads anything"; plugin._install_streaming_sessions: "never read or free its KV").
# SGLang's ``Session.create_req`` builds the foreign request on the session's last turn: its ``origin_input_ids`` and
# ``full_untruncated_fill_ids`` ARE the owner's token history (shared arrays) plus the foreign input. In
# ``Req.init_next_round_input`` the match key (``params.key``) is taken from those arrays before the match; kvshield's
# ``try_match_prefix`` aborts the request (``set_finish_with_abort``: origin replaced by one token) and detaches it,
# then runs SGLang's match with the same ``params`` -- the owner's history -- which the tree cache (here SGLang's
# default ``UnifiedRadixCache``, holding the first turn's prefix) answers with the owner's pages. In the same pass
# ``PrefillAdder`` admits the request (an abort counts its input only) and ``prepare_for_extend`` extends that prefix:
# its forward attends over the owner's KV (and its input is the owner's history, which globex never sent).
# The test drives SGLang's own ``Session.create_req`` (Reqs stamped by kvshield's scope as the scheduler hook does).
FOREIGN_TURN_READS_HISTORY = r"""
from array import array
from kvshield_sglang import engine_hooks
from sglang.srt.managers.io_struct import SessionParams, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.session.session_controller import Session

def tokenized(rid, ids):  # what the tokenizer sends for a request naming session "sa"
    return TokenizedGenerateReqInput(
        rid=rid, input_text="", input_ids=array("q", ids), input_embeds=None, mm_inputs=None, token_type_ids=None,
        sampling_params=SamplingParams(max_new_tokens=4), return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=False, session_params=SessionParams(id="sa"))

w = session_world.World("unified", int(os.environ["PS"]))
sess = Session(1 << 20, session_id="sa", streaming=True)
with engine_hooks.building("acme"):             # Scheduler.handle_generate_request of an acme request
    t0 = sess.create_req(tokenized("t0", list(range(1, 10))), None, 100)
b = w._prefill(t0)
w._write(b, t0, 1, 1)                           # acme's KV: tenant code 1
t0.kv_committed_len = len(t0.origin_input_ids)
common.maybe_cache_unfinished_req(t0, w.cache)
t0.output_ids = [55]
t0.finished_reason, t0.finished_len = FINISH_LENGTH(length=0), 1
common.release_kv_cache(t0, w.cache)            # finished: the session keeps it (finish_req: not in flight)
w.alloc.end_step()
with engine_hooks.building("globex"):           # a globex request naming acme's session
    f = sess.create_req(tokenized("g", [9000, 9001]), None, 100)
bf = servers.prefill(w.cache, [f])              # one scheduler pass: match (refused by kvshield), admission, extend
OUT["refused"] = f.to_finish is not None and f.session is None
OUT["admitted"] = bf is not None
if bf is not None:
    n = int(bf.seq_lens_cpu[0])
    slots = w.cache.req_to_token_pool.req_to_token[f.req_pool_idx, :n].to(torch.int64)
    got = w.kv.read(slots)[0, :, 0, 0].tolist()
    OUT["prefix_len"] = int(bf.prefix_lens[0])
    OUT["attends_to"] = got
    OUT["acme_positions"] = [i for i, v in enumerate(got) if int(v) // 10000 == 1]
else:
    OUT["acme_positions"] = []
"""


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_refused_foreign_turn_never_reads_the_sessions_history(jvm, tmp_path, page_size):
    out = _run(tmp_path, FOREIGN_TURN_READS_HISTORY, PS=str(page_size))
    assert out["refused"], "kvshield did not refuse the foreign request (precondition)"
    assert not out["acme_positions"], (
        f"isolation: globex's request, refused at its match, was admitted with acme's history as its prefix "
        f"({out.get('prefix_len')} tokens) and attends to acme's KV at positions {out['acme_positions']} "
        f"(values {out.get('attends_to')})")



# --------------------------------------------------------------------------------------------------------------
# 8. Quota admission crashes the scheduler when the running batch holds a request that finished in the last step.
# --------------------------------------------------------------------------------------------------------------
# Promise (plugin._install_tenant_quota: a tenant quota is "a per-request outcome"; README "fail closed, loudly,
# pool unchanged" -- never a scheduler crash on ordinary traffic). A request finishes in two phases (SGLang's own
# note in ``PrefillAdder.preempt_to_schedule``): ``release_kv_cache`` in ``process_batch_result`` (``req.kv = None``),
# then the filter out of ``running_batch`` in ``update_running_batch`` -- and ``get_new_batch_prefill`` runs between
# them, "so running_batch may still contain requests whose KV cache is already freed". The quota hook's first
# ``add_one_req`` of a pass sums ``worst_case_pages(r, grown=True)`` over ``running_batch.reqs``, which (new in
# 25d087e) reads ``r.kv.kv_allocated_len``: AttributeError on the finished request, out of the scheduler loop. Any
# tenant with a quota admitting anything right after any request (of any tenant) finished a decode step.
FINISHED_IN_RUNNING_BATCH = r"""
import jpype
from fakes import MHAPool
import sglang.srt.mem_cache.allocator.paged as paged
servers.publish_server_args(attention_backend="torch_native")
kv = MHAPool(64, 4)
a = paged.PagedTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", kv, False)
a._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(8))
cache = servers.radix_cache(a)
r = servers.request("r", [1, 2, 3, 4, 5], "globex", max_new_tokens=2)
br = servers.prefill(cache, [r])                # globex's request, running
from array import array
r.output_ids, r.kv_committed_len = array("q", [7]), 5
r.finished_reason, r.finished_len = FINISH_LENGTH(length=1), 1
common.release_kv_cache(r, cache)               # process_batch_result: finished, released; still in running_batch
a.end_step()
n = servers.request("n", [10, 11, 12, 13], "acme", max_new_tokens=4)
try:
    bn = servers.prefill(cache, [n], running=br)  # the next admission pass (before update_running_batch filters)
    OUT["outcome"] = "admitted" if bn is not None else "waits"
except Exception as e:
    OUT["outcome"] = f"{type(e).__name__}: {e}"
"""


def test_quota_admission_survives_a_finished_request_in_the_running_batch(jvm, tmp_path):
    out = _run(tmp_path, FINISHED_IN_RUNNING_BATCH)
    assert out["outcome"] == "admitted", (
        f"quota admission with a just-finished request still in running_batch: {out['outcome']} (the scheduler "
        f"loop dies)")



# --------------------------------------------------------------------------------------------------------------
# 9. Decode server: a tenant's second request arriving before its first is preallocated crashes the scheduler.
# --------------------------------------------------------------------------------------------------------------
# Promise (disagg._check_decode_quota: "Raises HandoffError unless req's tenant quota holds its worst case ...: a
# quota is a per-request outcome"; the hooked ``DecodePreallocQueue.add`` turns a HandoffError into that request's
# abort). ``_check_decode_quota`` sums ``worst_case_pages(r, grown=True)`` over the tenant's requests already in the
# prealloc queue -- requests SGLang has not preallocated yet, whose ``req.kv`` is None -- and (new in 25d087e)
# ``worst_case_pages`` reads ``r.kv.kv_allocated_len``: an AttributeError, not a HandoffError, escapes ``add`` into
# the scheduler loop. Any burst of two requests of a tenant with a quota does it. Driven here on kvshield's own check
# with SGLang's ``Req`` objects as ``DecodePreallocQueue.add`` sees them (the queue's entries carry ``.req``).
DECODE_QUOTA_QUEUED = r"""
import jpype, types
from fakes import MHAPool
import sglang.srt.mem_cache.allocator.paged as paged
from kvshield_sglang import disagg
from kvshield_sglang.errors import HandoffError
servers.publish_server_args(attention_backend="torch_native")
kv = MHAPool(64, 4)
a = paged.PagedTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", kv, False)
a._j.pool().tenants().register("acme", jpype.JClass("dev.kvshield.tenant.TenantPolicy").withQuota(
    int(os.environ.get("QUOTA", "8"))))
if os.environ.get("PLANTED") == "queued-holds-all":  # planted bug: a queued request counted as holding its worst case
    from kvshield_sglang import tenants
    tenants.held_pages = lambda req, ps: tenants.request_pages(req, ps) if req.kv is None else 0
first = servers.request("d1", [1, 2, 3, 4], "acme", max_new_tokens=4)   # queued, not preallocated: kv is None
second = servers.request("d2", [5, 6, 7, 8], "acme", max_new_tokens=4)
queue = types.SimpleNamespace(scheduler=types.SimpleNamespace(running_batch=types.SimpleNamespace(reqs=[])),
                              queue=[types.SimpleNamespace(req=first), types.SimpleNamespace(req=second)],
                              transfer_queue=types.SimpleNamespace(queue=[]))
OUT["first_kv"] = repr(first.kv)
try:
    disagg._check_decode_quota(queue, a, second)
    OUT["outcome"] = "admitted"
except HandoffError as e:
    OUT["outcome"] = f"refused: {e}"
except Exception as e:
    OUT["outcome"] = f"crash {type(e).__name__}: {e}"
"""


def test_the_decode_quota_check_survives_a_tenants_queued_requests(jvm, tmp_path):
    out = _run(tmp_path, DECODE_QUOTA_QUEUED)
    assert not out["outcome"].startswith("crash"), (
        f"decode quota: a tenant's second queued request (the first not preallocated, kv {out['first_kv']}) makes "
        f"the quota check raise out of DecodePreallocQueue.add: {out['outcome']}")


def test_a_tenants_queued_decode_request_counts_its_whole_worst_case(jvm, tmp_path):
    """A request queued for preallocation holds nothing yet but will take its whole worst case (2 pages): with a
    3-page quota the tenant's second request (2 pages) does not fit beside it: refused now (503), not admitted
    into a decode batch that would fail."""
    out = _run(tmp_path, DECODE_QUOTA_QUEUED, QUOTA="3")
    assert out["outcome"] == "refused: request d2 needs up to 2 KV pages; tenant acme's quota has 1 of 3 left on " \
                             "this decode server", out


def test_twin_a_queued_decode_request_counted_as_holding_its_pages_admits_past_the_quota(jvm, tmp_path):
    out = _run(tmp_path, DECODE_QUOTA_QUEUED, QUOTA="3", PLANTED="queued-holds-all")
    assert out["outcome"] == "admitted", out
