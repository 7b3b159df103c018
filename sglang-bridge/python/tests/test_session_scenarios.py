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

MAIN = ["sessions-unified-p1", "sessions-unified-p4", "sessions-chunk-p4"]


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
