"""A tenant quota on a diffusion LLM server (SGLang's dLLM scheduler, ``dllm_world``): a per-request outcome, never a
failed batch allocation. SGLang's dLLM scheduler allocates a block per round, past the tokens a request keeps, through
``add_dllm_staging_req`` (past ``add_one_req``), and keeps its requests in its dLLM manager between rounds (never in
the running batch); while one of them waits to prefill, none decodes. Found by attack: the quota counted a dLLM request
as input + ``max_new_tokens`` and never counted the requests between their rounds, so a request was admitted past its
tenant's quota and a later round's allocation failed ("Prefill out of memory": the whole batch, the scheduler loop
dies), with the pool holding room for it."""

import pytest

from server_scenarios import run_scenario, scheduler_scenario

_PLANTS = r"""
def plant():  # after start: a hook replaced before it stops the rank there
    if os.environ.get("PLANTED") == "no-dllm-block":     # a dLLM request's worst case without its block
        from kvshield_sglang import tenants
        tenants.dllm_block_tokens = lambda req: 0
    elif os.environ.get("PLANTED") == "no-fetch-gate":   # no quota where requests enter the dLLM manager
        from sglang.srt.dllm.mixin.scheduler import SchedulerDllmMixin
        SchedulerDllmMixin._fetch_waiting_reqs = SchedulerDllmMixin._fetch_waiting_reqs.__wrapped__
def outcome(q):
    return [q.finished(), type(q.finished_reason).__name__, getattr(q.finished_reason, "message", None),
            getattr(q.finished_reason, "status_code", None)]
def run(w, arrivals, aborts=None, before=None):
    # scheduler iterations until nothing is left; arrivals: step -> requests; aborts: step -> [(rid, tenant)];
    # before(i) runs before step i. The cache is evicted whenever nothing runs (pool pressure would; a tenant's
    # cached pages count toward its quota)
    OUT["steps"] = []
    try:
        for i in range(40):
            w.s.waiting_queue += arrivals.get(i, [])
            for rid, tenant in (aborts or {}).get(i, []):
                w.abort(rid, tenant)
            if before is not None:
                before(i)
            ran = w.step()
            OUT["steps"].append([ran, {t: w.alloc.tenant_owned_pages(t) for t in w.quotas}])
            if ran is None and not w.s.waiting_queue and i >= max(arrivals):
                break
            if ran is None:
                w.evict_cache()
    except Exception as e:
        OUT["error"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    OUT["max_owned"] = w.max_owned
    w.evict_cache()
    OUT["after_eviction"] = {t: w.alloc.tenant_owned_pages(t) for t in w.quotas}
    OUT["rejected_frees"], OUT["available"] = w.alloc.rejected_frees(), w.alloc.available_size()
"""

BLOCK_WORST_CASE = scheduler_scenario(_PLANTS + r"""
import dllm_world
a, kv = allocator(4, size=64)
w = dllm_world.World(a, kv, 8, {"acme": int(os.environ["QUOTA"])}, fdfo=os.environ.get("FDFO") == "1")
plant()
x = w.request("x", list(range(1, 7)), "acme", 3, 1.0)   # 6 tokens + 3 new, in rounds of 8-token blocks
def foreign_byte(i):  # planted bug (of the pool): a slot x reads still holds another request's bytes
    if i == 1:
        kv.k_buffer[0][w.s.req_to_token_pool.req_to_token[x.req_pool_idx, 0]] = 5.0
run(w, {0: [x]}, before=foreign_byte if os.environ.get("PLANTED") == "foreign-byte" else None)
OUT["x"] = outcome(x)
""")


@pytest.mark.parametrize("fdfo", ["0", "1"])
def test_a_dllm_requests_worst_case_holds_its_blocks(jvm, tmp_path, fdfo):
    """X: 6 tokens and 3 new, 3 pages by the non-dLLM rule; its rounds allocate two 8-token blocks (16 tokens, 4
    pages: the second starts at 8, past its 9-token sequence's 3 pages). Under a 3-page quota it was admitted and its
    second round failed the batch. Expected: X needs up to 4 pages (its input and new tokens less one, plus a block:
    a round starts with at most 8 tokens kept, its prefix no longer), so it is aborted (400) naming that, and its
    abort's one round (one block, 2 pages) runs within the quota; under a 4-page quota it runs to its end. Every
    round reads back only X's own KV; the tally returns to 0. Synchronous and FDFO (SGLang's default: a block
    unresolved by its first forward keeps its KV for the next round) scheduling alike."""
    out = run_scenario(tmp_path, BLOCK_WORST_CASE, QUOTA="3", FDFO=fdfo)
    assert "error" not in out, f"a dLLM round failed the batch on the tenant quota: {out}"
    assert out["x"] == [True, "FINISH_ABORT", "request x needs up to 4 KV pages; tenant acme's quota is 3 pages",
                        400], out
    assert out["max_owned"] == {"acme": 2} and out["after_eviction"] == {"acme": 0} and out["rejected_frees"] == 0, out

    out = run_scenario(tmp_path, BLOCK_WORST_CASE, QUOTA="4", FDFO=fdfo)
    assert "error" not in out and out["x"] == [True, "FINISH_LENGTH", None, None], out
    assert out["max_owned"] == {"acme": 4} and out["after_eviction"] == {"acme": 0} and out["available"] == 64, out


def test_twin_the_dllm_worlds_oracle_sees_another_requests_bytes(jvm, tmp_path):
    out = run_scenario(tmp_path, BLOCK_WORST_CASE, QUOTA="4", FDFO="0", PLANTED="foreign-byte")
    assert out["error"] == "AssertionError: request x reads KV that is not its own: values [1.0, 5.0]", out


def test_twin_a_dllm_worst_case_without_its_block_fails_the_batch(jvm, tmp_path):
    out = run_scenario(tmp_path, BLOCK_WORST_CASE, QUOTA="3", PLANTED="no-dllm-block")
    assert out["error"].startswith("RuntimeError: Prefill out of memory"), out
    assert out["x"][0] is False, out


BETWEEN_ROUNDS = scheduler_scenario(_PLANTS + r"""
import dllm_world
a, kv = allocator(4, size=64)
w = dllm_world.World(a, kv, 4, {"acme": 6, "globex": 5}, fdfo=os.environ.get("FDFO") == "1")
plant()
r = {"x": w.request("x", list(range(1, 5)), "acme", 12, 1.0),     # 4 tokens + 12 new: up to 19 tokens, 5 pages
     "y": w.request("y", list(range(11, 15)), "acme", 12, 2.0),   # the same
     "g": w.request("g", list(range(21, 25)), "globex", 8, 3.0),  # up to 15 tokens, 4 pages
     "h": w.request("h", list(range(31, 51)), "globex", 4, 4.0)}  # up to 27 tokens: over globex's whole quota
# y and h arrive while x and g decode; globex's abort naming x (and acme's naming g) end nothing; acme's ends x
run(w, {0: [r["x"], r["g"]], 2: [r["y"], r["h"]]},
    {2: [("x", "globex"), ("g", "acme")], int(os.environ.get("ABORT_X_AT", "99")): [("x", "acme")]})
OUT["reqs"] = {k: outcome(q) for k, q in r.items()}
OUT["outputs"] = {k: len(q.output_ids) for k, q in r.items()}
OUT["aborts_sent"] = w.aborts_sent
""")


@pytest.mark.parametrize("fdfo", ["0", "1"])
@pytest.mark.parametrize("abort_x_at", [None, 3])
def test_a_dllm_tenant_quota_counts_requests_between_their_rounds(jvm, tmp_path, abort_x_at, fdfo):
    """Acme (6 pages) has X decoding when Y arrives; X's worst case (5 pages) and Y's exceed the quota, so Y stays in
    the scheduler's waiting queue (before the fix it entered the dLLM manager, was admitted beside X, and a later
    round failed the batch; had it waited inside the manager, its pending prefill would have stopped every tenant's
    decoding) while globex's requests move past it: G runs, H (over globex's whole quota) is aborted (400) naming
    its need and runs its one-round abort. Y runs once X ended (finished, or aborted by acme's client: released once,
    no free refused) and its cached pages were evicted. Aborts naming another tenant's request end nothing. Every
    round reads back only its request's own KV; no tenant ever owns more than its quota; every tally returns to 0."""
    env = {"FDFO": fdfo} if abort_x_at is None else {"FDFO": fdfo, "ABORT_X_AT": str(abort_x_at)}
    out = run_scenario(tmp_path, BETWEEN_ROUNDS, **env)
    assert "error" not in out, f"a dLLM round failed the batch on the tenant quota: {out}"
    assert out["reqs"]["y"][:2] == [True, "FINISH_LENGTH"] and out["reqs"]["g"][:2] == [True, "FINISH_LENGTH"], out
    assert out["reqs"]["h"] == [True, "FINISH_ABORT", "request h needs up to 7 KV pages; tenant globex's quota is 5 "
                                "pages", 400], out
    y_first = next(i for i, (ran, _) in enumerate(out["steps"]) if ran and "y" in ran)
    x_last = max(i for i, (ran, _) in enumerate(out["steps"]) if ran and "x" in ran)
    assert y_first > x_last, f"y ran beside x, past acme's quota: {out['steps']}"
    if abort_x_at is None:
        assert out["reqs"]["x"][:2] == [True, "FINISH_LENGTH"] and out["aborts_sent"] == [], out
    else:  # SGLang's abort of a dLLM request pops it from the manager (never finished) and releases its KV
        assert out["aborts_sent"] == ["x"] and out["reqs"]["x"][0] is False and out["outputs"]["x"] < 12, out
    assert out["after_eviction"] == {"acme": 0, "globex": 0} and out["rejected_frees"] == 0, out
    assert out["available"] == 64, out


def test_twin_no_quota_where_dllm_requests_enter_the_manager_fails_the_batch(jvm, tmp_path):
    out = run_scenario(tmp_path, BETWEEN_ROUNDS, PLANTED="no-fetch-gate")
    assert out["error"].startswith("RuntimeError: Prefill out of memory"), out
