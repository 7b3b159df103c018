"""Streaming-session scenarios on the real SGLang (:mod:`session_world`): two tenants' streaming sessions over
several turns, interleaved with the other tenant's plain requests in a small pool, every session's kept KV and
every turn's history read back after every step; a request naming another tenant's session refused; the
orphaned tail freed at a match, a mid-turn abort and each session's close freed as the session's, a turn SGLang
detached from its session refused the session's KV and its row, a running turn's KV untouched by a second request
and a close arriving beside it, nothing leaked. The planted-bug twins (a turn's release no longer leaves the kept
KV the session's; a detached turn still frees as the session or keeps its row; a second turn let in; a refused
turn matched on its key) must fail the content oracle."""

import json

import pytest

import scenarios
from conftest import TEST_CLASSES
from server_scenarios import (run_scenario, scheduler_scenario, session_scenario,
                              tokenizer_scenario)

MAIN = ["sessions-unified-p1", "sessions-unified-p4", "sessions-chunk-p4", "sessions-kvshield-p4"]


@pytest.fixture(scope="module")
def world(jvm, tmp_path_factory):
    return scenarios.run_world("session_world", tmp_path_factory.mktemp("sessions"), TEST_CLASSES,
                               KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64")


@pytest.mark.parametrize("name", MAIN)
def test_streaming_sessions_read_back_only_their_own_kv_across_turns_and_leak_nothing(world, name):
    scenarios.passes(world, name)


@pytest.mark.parametrize("name", ["twin-session-kv-released-unified-p4", "twin-detached-turn-still-serves-unified-p4",
                                  "twin-second-live-turn-let-in-unified-p1", "twin-refused-turn-matches-its-key-unified-p4",
                                  "twin-detached-turn-keeps-the-row-chunk-p4"])
def test_twin_planted_bug_is_caught_by_the_content_oracle(world, name):
    scenarios.fails(world, name, "isolation")


# A session opened by acme (tenant header), on SGLang's TokenizerManager/Scheduler handlers and SessionController:
# bound to acme at its open (globex's first turn on it is refused), globex's close refused (the session stays open,
# its kept KV reads back acme's values), acme's close closes it. TWIN=1 plants the bug: the stock close handler.
SESSION_CONTROL = r"""
import json, os
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
from sglang.srt.managers.io_struct import CloseSessionReqInput, OpenSessionReqInput
from sglang.srt.managers.scheduler import Scheduler

class Request:  # FastAPI's request as the HTTP entry points pass it: headers only matter here
    def __init__(self, tenant):
        self.headers = {"X-Tenant": tenant}

if os.environ["TWIN"] == "1":
    Scheduler.close_session = Scheduler.close_session.__wrapped__
out = {}
with servers.single_rank():
    w = session_world.World("unified", 4)
    controller, tm, control = session_world.session_control(w)
    [(opened, _)] = control(tm.open_session(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id="sa",
                                                                streaming=True), Request("acme")))
    out["rid_restored"] = opened.rid is None
    s = w.open("sa", "acme")
    s.session = controller.sessions["sa"]
    w.foreign_turn("sa", "globex")              # before any acme turn: the session is acme's from its open
    w.turn("sa", range(1, 8))
    kept = w._kept_slots(s).clone()
    control(tm.close_session(CloseSessionReqInput(session_id="sa"), Request("globex")))
    w.plain("globex")                           # globex takes every free page and writes its KV
    w._read(kept, s.tenant_code, s.code, "session sa's kept KV after globex's close")
    out["open_after_foreign_close"] = "sa" in controller.sessions
    control(tm.close_session(CloseSessionReqInput(session_id="sa"), Request("acme")))
    out["open_after_own_close"] = "sa" in controller.sessions or "sa" in w._slots()
print("CONTROL " + json.dumps(out))
"""


@pytest.mark.parametrize("twin", ["0", "1"])
def test_a_session_is_bound_to_its_opener_and_closed_only_by_it(jvm, tmp_path, twin):
    r = scenarios.run(scenarios.script(SESSION_CONTROL), tmp_path, TEST_CLASSES, TWIN=twin,
                      KVSHIELD_TENANT_HEADER="x-tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64")
    lines = [x for x in r.stdout.splitlines() if x.startswith("CONTROL ")]
    if twin == "1":  # planted bug: the content oracle catches the foreign close
        assert r.returncode != 0 and "isolation: session sa's kept KV" in r.stderr, r.stdout[-2000:] + r.stderr[-3000:]
        return
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-4000:]
    out = json.loads(lines[-1][len("CONTROL "):])
    assert out == {"rid_restored": True, "open_after_foreign_close": True, "open_after_own_close": False}, out


# A radix-native session id (--enable-session-radix-cache: a request's top-level session_id) that was never opened:
# SGLang pins each request's leaves under the id at first use, and a close naming it releases them. The id is its
# first request's tenant's: another tenant's request naming it is refused before its leaves join the id's refs, and
# another tenant's open or close of it is refused, the refs untouched; the first user's close frees the id.
# TWIN=1 plants the bug: no binding of never-opened ids.
RADIX_NATIVE = r"""
import json, os, types
from array import array
from kvshield_sglang import engine_hooks, plugin
plugin.load()
import servers
servers.publish_server_args()
ONE_RANK = servers.single_rank()  # for the whole script: a one-rank server
ONE_RANK.__enter__()
from kvshield_sglang.tenants import TenantChannel
from sglang.srt.managers.io_struct import CloseSessionReqInput, OpenSessionReqInput
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.session.session_controller import SessionController

if os.environ["TWIN"] == "1":
    plugin._radix_session_users = lambda scheduler: {}
released = []
tree = types.SimpleNamespace(release_radix_session=released.append, open_radix_session=lambda sid: None,
                             release_session=lambda sid: None)
sched = types.SimpleNamespace(enable_session_radix_cache=True, disable_radix_cache=True, tree_cache=tree,
                              session_controller=SessionController(tree),
                              ps=types.SimpleNamespace(pp_rank=0, tp_rank=0, attn_cp_rank=0))
channel = TenantChannel.from_rank_dir()
def request(rid, tenant):
    with engine_hooks.building(tenant):
        req = Req(rid, "", array("q", [7, 8]), SamplingParams(max_new_tokens=1), session_id="rs")
    Scheduler._maybe_namespace_elastic_radix_cache(sched, req)
    return req.to_finish is None and req.session_id == "rs"
def control(kind, tenant):  # what the tokenizer's hook seals for the tenant's open or close
    obj = kind(session_id="rs", **({"capacity_of_str_len": 1 << 10} if kind is OpenSessionReqInput else {}))
    obj.rid = channel.seal("session:rs", tenant, None)
    return (Scheduler.open_session if kind is OpenSessionReqInput else Scheduler.close_session)(sched, obj)
out = {"acme_first": request("acme-1", "acme"), "globex_request": request("globex-1", "globex")}
out["globex_open"] = getattr(control(OpenSessionReqInput, "globex"), "success", None)
control(CloseSessionReqInput, "globex")
out["released_by_globex"] = list(released)
out["acme_again"] = request("acme-2", "acme")
control(CloseSessionReqInput, "acme")
out["released_by_acme"] = list(released)
out["globex_after_close"] = request("globex-2", "globex")
print("RADIX " + json.dumps(out))
"""


@pytest.mark.parametrize("twin", ["0", "1"])
def test_a_never_opened_radix_session_id_is_its_first_users(jvm, tmp_path, twin):
    out = scenarios.run_reporting(RADIX_NATIVE, "RADIX ", tmp_path, TEST_CLASSES, TWIN=twin,
                                  KVSHIELD_TENANT_HEADER="x-tenant")
    if twin == "1":  # planted bug: globex pins its leaves under acme's id and releases acme's refs
        assert out["globex_request"] and "rs" in out["released_by_globex"], out
        return
    assert out == {"acme_first": True, "globex_request": False, "globex_open": False, "released_by_globex": [],
                   "acme_again": True, "released_by_acme": ["rs"], "globex_after_close": True}, out


# --------------------------------------------------------------------------------------------------------------
# Streaming sessions: the session's KV is released (scrubbed, handed to another tenant) when a turn ends.
# --------------------------------------------------------------------------------------------------------------

SESSION_KV_RELEASED = scheduler_scenario(r"""
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
""")


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
    out = run_scenario(tmp_path, SESSION_KV_RELEASED, PS=str(page_size))
    assert out["session_holds_kv"], out
    assert all(o == "acme" for o in out["owners_after_turn"]), f"session pages released at the turn's end: {out}"
    assert not out["globex_got_session_slots"], f"another tenant was handed the session's slots: {out}"
    assert out["session_kv"] == [5.0] * 10, f"the session's KV was overwritten: {out}"


SESSION_NEXT_TURN = scheduler_scenario(r"""
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
""")


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
    out = run_scenario(tmp_path, SESSION_NEXT_TURN, PS="4")
    assert "error" not in out, f"the session's second turn crashed the prefill step: {out['error']}"
    assert out["admitted"] and out["prefix"] == 10, out
    assert out["history"] == [5.0] * 10, f"the session's second turn does not read its own history: {out}"


# --------------------------------------------------------------------------------------------------------------
# A streaming session released while one of its turns still runs hands that turn's KV to another tenant.
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
SESSION_RELEASED_UNDER_LIVE_TURN = session_scenario(r"""
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
""")


@pytest.mark.parametrize("cache,page_size,how", [("unified", 4, "close"), ("unified", 1, "other-turn-abort"),
                                                  ("chunk", 4, "close")])
def test_a_session_released_while_its_turn_runs_never_hands_that_turns_kv_to_another_tenant(
        jvm, tmp_path, cache, page_size, how):
    out = run_scenario(tmp_path, SESSION_RELEASED_UNDER_LIVE_TURN, CACHE=cache, PS=str(page_size), HOW=how)
    assert not out["foreign_positions"], (
        f"isolation: acme's running streaming turn reads another tenant's KV at history positions "
        f"{out['foreign_positions']} (values {out['t1_reads']}; page owners now {out['owners']})")


# 1b. The same, with no SGLang quirk beyond its normal paths: a running turn T1 is retracted under memory pressure
# (``retract_decode`` -> ``release_req`` -> ``release_kv_cache(is_insert=False)``: the streaming session saves T1's
# KV in its slot and ``finish_req`` clears the in-flight flag), so the client's next turn T2 is accepted and runs
# on the slot; the retracted T1 is scheduled again (matched onto the slot, re-prefilled) and its client aborts it
# mid-turn: its release runs ``release_session`` and the leftovers release as the session -- T2's pages too.
RETRACTED_TURN_ABORT_UNDER_LIVE_TURN = session_scenario(r"""
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
""")


@pytest.mark.parametrize("cache,page_size", [("unified", 4), ("unified", 1)])
def test_a_retracted_turns_abort_never_hands_the_running_turns_kv_to_another_tenant(jvm, tmp_path, cache, page_size):
    out = run_scenario(tmp_path, RETRACTED_TURN_ABORT_UNDER_LIVE_TURN, CACHE=cache, PS=str(page_size))
    assert not out["foreign_positions"], (
        f"isolation: acme's running streaming turn T2 reads another tenant's KV at history positions "
        f"{out['foreign_positions']} after the retracted turn T1's abort released the session (values "
        f"{out['t2_reads']}; page owners now {out['owners']})")


# --------------------------------------------------------------------------------------------------------------
# A turn restored onto the session's slot, then aborted before its prefill, gives the session's req_to_token row
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
DETACHED_TURN_GIVES_ROW_AWAY = session_scenario(r"""
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
""")


@pytest.mark.parametrize("cache,page_size", [("unified", 4), ("chunk", 1)])
def test_a_turn_aborted_after_its_match_never_gives_the_sessions_history_to_another_tenant(
        jvm, tmp_path, cache, page_size):
    out = run_scenario(tmp_path, DETACHED_TURN_GIVES_ROW_AWAY, CACHE=cache, PS=str(page_size))
    assert not out["foreign_positions"], (
        f"isolation: acme's next streaming turn reads another tenant's KV as its history at positions "
        f"{out['foreign_positions']} (values {out['t2_reads']}; page owners {out['owners']}; the session's row was "
        f"freed while its slot named it: {out['row_free_while_slot_names_it']}, globex's request got row "
        f"{out['globex_row']})")


# --------------------------------------------------------------------------------------------------------------
# Another tenant's CloseSessionReqInput closes a tenant's streaming session: its kept KV is freed (as the
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
FOREIGN_CLOSE = session_scenario(r"""
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
""")


def test_another_tenants_close_request_never_releases_a_tenants_streaming_session(jvm, tmp_path):
    out = run_scenario(tmp_path, FOREIGN_CLOSE, KVSHIELD_TENANT_HEADER="x-tenant")
    assert out["session_still_open"] and all(o == "acme" for o in out["acme_kv_still_held"]), (
        f"isolation: a globex CloseSessionReqInput closed acme's streaming session (reached the scheduler: "
        f"{out['close_reached_scheduler']}; session open: {out['session_still_open']}; owners of acme's kept KV now "
        f"{out['acme_kv_still_held']})")


# --------------------------------------------------------------------------------------------------------------
# The foreign request kvshield refuses at its match is still matched on the session's history and, in the same
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
FOREIGN_TURN_READS_HISTORY = session_scenario(r"""
from kvshield_sglang import engine_hooks
from sglang.srt.session.session_controller import Session

from session_world import tokenized

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
""")


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_refused_foreign_turn_never_reads_the_sessions_history(jvm, tmp_path, page_size):
    out = run_scenario(tmp_path, FOREIGN_TURN_READS_HISTORY, PS=str(page_size))
    assert out["refused"], "kvshield did not refuse the foreign request (precondition)"
    assert not out["acme_positions"], (
        f"isolation: globex's request, refused at its match, was admitted with acme's history as its prefix "
        f"({out.get('prefix_len')} tokens) and attends to acme's KV at positions {out['acme_positions']} "
        f"(values {out.get('attends_to')})")


# --------------------------------------------------------------------------------------------------------------
# A NON-streaming session opened by acme accepts globex's turn: globex's request is built on acme's conversation
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
NONSTREAMING_FOREIGN_TURN = session_scenario(r"""
import asyncio, types
from array import array
from kvshield_sglang import engine_hooks
from sglang.srt.managers.io_struct import OpenSessionReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.session.session_controller import SessionController

class Request:
    def __init__(self, headers):
        self.headers = headers

from session_world import tokenized

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
""")


def test_a_non_streaming_session_refuses_another_tenants_turn(jvm, tmp_path):
    out = run_scenario(tmp_path, NONSTREAMING_FOREIGN_TURN, KVSHIELD_TENANT_HEADER="x-tenant")
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
    out = run_scenario(tmp_path, NONSTREAMING_FOREIGN_TURN, KVSHIELD_TENANT_HEADER="x-tenant", PLANTED="no-create-check")
    assert out["bound_to"] == "acme", out
    assert not out["globex_refused"] and out["globex_prompt_has_acme_tokens"], out  # the content check sees the leak
    assert out["globex_in_session_tree"] and out["session_tree_after"] != ["acme-t0"], out
    assert not out["radix_native_refused"], out


# --------------------------------------------------------------------------------------------------------------
# A streaming session closed while its turn runs leaves its slot (deferred release) keyed by the session id;
#    another tenant re-opens that id and its first turn is restored onto the first tenant's KV.
# --------------------------------------------------------------------------------------------------------------
SESSION_ID_REUSE = tokenizer_scenario(r"""
from kvshield_sglang import engine_hooks
import session_world
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.managers.io_struct import CloseSessionReqInput, OpenSessionReqInput
def Tenant(tenant):
    return Request({"X-Tenant": tenant})
from session_world import tokenized
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
""")


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
    out = run_scenario(tmp_path, SESSION_ID_REUSE, KVSHIELD_TENANT_HEADER="x-tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64")
    assert out["bound"] == "acme" and out["t1_prefix"] == 12, out         # T1 ran on acme's kept KV
    assert out["new_bound"] is None and out["open_answer"] is False, (
        f"globex reopened the id of acme's session whose KV T1 still runs on: {out}")


def test_a_turn_never_restores_a_slot_kept_for_another_session_object(jvm, tmp_path):
    """The second check behind the open's: with the open's check planted off (globex's open succeeds), globex's turn
    on the reopened id is refused at its match and reads none of acme's KV."""
    out = run_scenario(tmp_path, SESSION_ID_REUSE, KVSHIELD_TENANT_HEADER="x-tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64",
               PLANTED="open-unchecked")
    assert out["new_bound"] == "globex" and out["u1_refused"], out
    assert not out["u1_reads_acme"] and not out["u1_row_is_t1_row"], (
        f"isolation: globex's turn on the re-opened session id reads acme's KV at positions {out['u1_reads_acme']} "
        f"(values {out['u1_prefix_values']}; shares T1's row: {out['u1_row_is_t1_row']})")


def test_twin_without_either_check_a_reopened_id_reads_the_first_tenants_kv(jvm, tmp_path):
    out = run_scenario(tmp_path, SESSION_ID_REUSE, KVSHIELD_TENANT_HEADER="x-tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64",
               PLANTED="unchecked")
    assert out["u1_reads_acme"] and out["u1_row_is_t1_row"], out


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


# --------------------------------------------------------------------------------------------------------------
# A turn SGLang drops from its waiting queue after its match (a client's abort, the waiting timeout) stays the
#    session's live turn for good: every later turn is refused, the close never completes, the KV stays held.
# --------------------------------------------------------------------------------------------------------------
# SGLang matches every waiting request each round (the turn is restored onto the session's slot, and kvshield makes
# it the session's live turn), then admits what fits; one left waiting and dropped there (``abort_request``'s
# "method 1", ``_abort_on_waiting_timeout``, ``_abort_on_queued_limit``) is never released. Stock SGLang recovers:
# the client's next turn, refused by ``create_req`` (in flight), clears the flag when ``find_active_slot`` detaches
# it, and the one after runs over the history. With the dropped turn still live, kvshield refused every later turn
# as a second live turn and kept the flag set, so the close was deferred for good and the session's pages never
# came back (acme, page size 4: three turns refused, 40 of 48 tokens back after the close); with priority scheduling
# another tenant's request preempting the waiting turn did it too. PLANTED=keep-dropped-turn: the drop is not seen.
DROPPED_WAITING_TURN = tokenizer_scenario(r"""
import types
from kvshield_sglang import engine_hooks
from kvshield_sglang.tenants import TenantChannel
import session_world
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.io_struct import AbortReq, CloseSessionReqInput, OpenSessionReqInput
from sglang.srt.disaggregation.utils import DisaggregationMode
if PLANTED == "keep-dropped-turn":
    plugin._detach_turn = lambda tree_cache, req: None
def Tenant(tenant):
    return Request({"X-Tenant": tenant})
from session_world import tokenized
def turn(rid, ids):  # Session.create_req as the scheduler's handler runs it for acme
    with engine_hooks.building("acme"):
        return sa.create_req(tokenized(rid, ids), None, 100000)
def run(req, code):  # admitted, prefilled, written, finished and released
    b = w._prefill(req); w._write(b, req, 1, code); req.kv_committed_len = int(b.seq_lens_cpu[0])
    req.finished_reason, req.finished_len = FINISH_LENGTH(length=0), 0
    common.release_kv_cache(req, w.cache)
    w.alloc.end_step()
with servers.single_rank():
    w = session_world.World("unified", int(os.environ["PS"]))
    controller, tm, control = session_world.session_control(w)
    control(tm.open_session(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id="sa", streaming=True), Tenant("acme")))
    sa = controller.get("sa")
    HISTORY = list(range(4000, 4007))
    run(turn("acme-t0", HISTORY), 1)
    t1 = turn("acme-t1", [11, 12])
    t1.init_next_round_input(w.cache)               # matched in a scheduling round (restored onto the slot), not admitted
    sched = Scheduler.__new__(Scheduler)
    sched.waiting_queue, sched.tree_cache, sched.enable_hicache_storage = [t1], w.cache, False
    sched.ipc_channels = types.SimpleNamespace(send_to_tokenizer=types.SimpleNamespace(send_output=lambda out, req=None: None))
    if os.environ["HOW"] == "timeout":              # SGLANG_REQ_WAITING_TIMEOUT passed while it waited
        t1.time_stats.wait_queue_entry_time = 1e-9
        sched._abort_on_waiting_timeout()
    elif os.environ["HOW"] == "preempted":          # the queue is full: globex's higher-priority request takes its place
        sched.max_queued_requests, sched.enable_priority_scheduling = 1, True
        sched.schedule_low_priority_values_first, sched.enable_hierarchical_cache = False, False
        t1.priority = 0
        OUT["incoming_aborted"] = sched._abort_on_queued_limit(servers.request("globex-1", [7, 8], "globex", priority=10))
    else:                                           # its client disconnects: TokenizerManager's abort, sealed for acme
        sched.chunked_req = sched.mm_receiver = sched.dllm_config = sched.last_batch = None
        sched.disaggregation_mode, sched.ps = DisaggregationMode.NULL, types.SimpleNamespace(pp_size=1)
        sched.grammar_manager = types.SimpleNamespace(abort_requests=lambda recv_req: None)
        sched.running_batch = types.SimpleNamespace(reqs=[])
        sched.abort_request(AbortReq(rid=TenantChannel.from_rank_dir().seal(engine_hooks._ABORT, "acme", "acme-t1")))
    OUT["dropped"] = not sched.waiting_queue
    OUT["refused"], OUT["history"] = [], None
    for k in range(3):                              # the client's next turns (the first refused by create_req: in flight)
        t = turn(f"acme-t{2 + k}", [20 + k])
        if t.to_finish is None:
            t.init_next_round_input(w.cache)
        if t.to_finish is None:
            OUT["history"] = w.kv.read(t.prefix_indices.to(torch.int64))[0, :, 0, 0].tolist()
        else:
            OUT["refused"].append(t.to_finish.message)
        run(t, 1 if t.to_finish is None else 9)
        if OUT["history"] is not None:
            break
    control(tm.close_session(CloseSessionReqInput(session_id="sa"), Tenant("acme")))
    controller._last_reap_time = 0
    controller.maybe_reap(10 ** 9)                  # a deferred close completes here once no turn is in flight
    w.alloc.end_step()
    OUT["closed"] = "sa" not in controller.sessions and "sa" not in w._slots()
    OUT["back"], OUT["size"] = w.alloc.available_size() + w.cache.evictable_size(), session_world.SIZE
    OUT["rejected"] = w.alloc.rejected_frees()
""")


@pytest.mark.parametrize("how,page_size", [("timeout", 4), ("abort", 1), ("preempted", 4)])
def test_a_turn_dropped_from_the_waiting_queue_never_wedges_its_session(jvm, tmp_path, how, page_size):
    """Promise (README "Streaming sessions": at most one turn is live, "matched, not yet released"; a refused request
    matches nothing; no pages leak). A turn dropped while it waits is never released: it must stop being the live
    turn, so the client's next turn reads its session's history (acme's own KV, positions 0-6) and the close returns
    every page."""
    out = run_scenario(tmp_path, DROPPED_WAITING_TURN, HOW=how, PS=str(page_size), SGLANG_REQ_WAITING_TIMEOUT="5")
    assert out["dropped"], out
    assert out["history"] == [11000.0 + i for i in range(7)], (
        f"the session's next turn after a dropped one reads {out['history']} (refused: {out['refused']}), not its"
        " history")
    assert out["closed"] and out["back"] == out["size"] and out["rejected"] == 0, (
        f"leak: after the close {out['back']} of {out['size']} tokens back, closed={out['closed']}, {out['rejected']}"
        " free(s) refused")


def test_twin_a_dropped_turn_left_live_refuses_every_later_turn(jvm, tmp_path):
    out = run_scenario(tmp_path, DROPPED_WAITING_TURN, HOW="timeout", PS="4", SGLANG_REQ_WAITING_TIMEOUT="5",
                       PLANTED="keep-dropped-turn")
    assert out["dropped"] and out["history"] is None and len(out["refused"]) == 3, out  # the content oracle sees it
    assert not out["closed"] and out["back"] < out["size"], out


# --------------------------------------------------------------------------------------------------------------
# A session closed while its turn runs, the turn then retracted: the turn comes back as a first turn of the closed
#    session and its end builds a slot nothing ever releases.
# --------------------------------------------------------------------------------------------------------------
# The close is deferred to the running turn T1's end (kvshield's deferral: SGLang's in-flight flag was cleared by a
# refused duplicate's detach). SGLang retracts T1 (memory pressure: ``release_req`` -> ``release_kv_cache``), and
# the deferred close runs in that release, though T1 is not finished. T1 stayed the closed session's turn: back in
# the waiting queue it re-prefilled with no slot, and its end (``try_cache_finished_req``, ``is_first``) kept its KV
# in a new slot for a session SGLang had deleted: acme's 16 tokens held for good (32 of 48 back), the id never
# openable again. PLANTED=closed-session-kept: the retracted turn stays the session's.
RETRACTED_AFTER_CLOSE = session_scenario(r"""
from array import array
from kvshield_sglang import engine_hooks
from sglang.srt.managers.io_struct import OpenSessionReqInput, SessionParams, TokenizedGenerateReqInput
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.mem_cache.base_prefix_cache import EvictParams
from sglang.srt.session.session_controller import SessionController
if PLANTED == "closed-session-kept":
    plugin._leave_closed_session = lambda alloc, req, session: None
def turn(rid, ids):  # Session.create_req as the scheduler's handler runs it for acme
    tok = TokenizedGenerateReqInput(rid=rid, input_text="", input_ids=array("q", ids), input_embeds=None, mm_inputs=None,
        token_type_ids=None, sampling_params=SamplingParams(max_new_tokens=4), return_logprob=False, logprob_start_len=-1,
        top_logprobs_num=0, token_ids_logprob=None, stream=False, session_params=SessionParams(id="sa"))
    with engine_hooks.building("acme"):
        req = sa.create_req(tok, None, 100000)
    req.kvshield_tenant = "acme"
    return req
def prefill(req):  # admitted, prefilled, its KV written, decoding (one output token)
    b = w._prefill(req); w._write(b, req, 1, 1); req.kv_committed_len = int(b.seq_lens_cpu[0])
    common.maybe_cache_unfinished_req(req, w.cache)
    req.output_ids.append(5)
w = session_world.World("unified", 4)
controller = SessionController(w.cache)
controller.open(OpenSessionReqInput(capacity_of_str_len=1 << 20, session_id="sa", streaming=True))
sa = controller.get("sa")
sa.kvshield_tenant = "acme"                     # bound at its open (the open handler's hook)
t0 = turn("acme-t0", list(range(4000, 4012)))
b = w._prefill(t0); w._write(b, t0, 1, 1); t0.kv_committed_len = 12
t0.finished_reason, t0.finished_len = FINISH_LENGTH(length=0), 0
common.release_kv_cache(t0, w.cache); w.alloc.end_step()
t1 = turn("acme-t1", [11, 12, 13])              # accepted (in flight), not matched yet
t2 = turn("acme-t2", [20])                      # the duplicate, refused by create_req, matched first: SGLang clears the flag
t2.init_next_round_input(w.cache)
prefill(t1)                                     # T1 runs, restored onto the session's slot
controller._close("sa")                         # the client's close: no turn in flight for SGLang, deferred by kvshield
OUT["deferred"], OUT["closed"] = "sa" in w._slots(), "sa" not in controller.sessions
common.release_kv_cache(t1, w.cache, is_insert=False)  # retract_decode's release_req
t1.reset_for_retract()
w.alloc.end_step()
prefill(t1)                                     # T1 scheduled again, to its end
t1.finished_reason, t1.finished_len = FINISH_LENGTH(length=1), 1
common.release_kv_cache(t1, w.cache)
w.alloc.end_step()
OUT["slots_left"] = sorted(w._slots())
w.cache.evict(EvictParams(num_tokens=session_world.SIZE))
w.alloc.end_step()
OUT["back"], OUT["size"] = w.alloc.available_size() + w.cache.evictable_size(), session_world.SIZE
g = servers.request("globex-1", list(range(7000, 7000 + session_world.SIZE - 8)), "globex", max_new_tokens=1)
if w.alloc.available_size() >= session_world.SIZE:
    bg = w._prefill(g)                          # globex takes all but a page or two: it reads nothing of acme's
    OUT["globex_reads"] = sorted(set(w.kv.read(bg.out_cache_loc.to(torch.int64))[0, :, 0, 0].tolist()))
""")


@pytest.mark.parametrize("planted", ["", "closed-session-kept"])
def test_a_turn_retracted_after_its_sessions_close_never_keeps_kv_for_the_closed_session(jvm, tmp_path, planted):
    """Promise (README "Streaming sessions": "a close while a turn runs is deferred to that turn's end"; no pages leak):
    once the retracted turn ends, the closed session holds nothing: no slot, every page back, and globex, taking all
    but a page or two of the pool, reads only zeros."""
    out = run_scenario(tmp_path, RETRACTED_AFTER_CLOSE, PLANTED=planted)
    assert out["deferred"] and out["closed"], out
    if planted:
        assert out["slots_left"] == ["sa"] and out["back"] < out["size"] and "globex_reads" not in out, out
        return
    assert not out["slots_left"] and out["back"] == out["size"], (
        f"leak: slot(s) {out['slots_left']} kept for the closed session, {out['back']} of {out['size']} tokens back")
    assert out["globex_reads"] == [0.0], f"globex's fresh pages hold {out['globex_reads']}"
