"""A tenant's page quota is a per-request outcome in SGLang's scheduler, never a failed batch allocation
(SGLang's ``allocation.py`` raises on an allocator's ``None``): SGLang's own ``PrefillAdder`` and
``ScheduleBatch.prepare_for_extend`` with kvshield's hook on ``add_one_req``. Twin: without the hook, SGLang
admits the over-quota request and its prefill step fails."""

import re

import scenarios
from conftest import TEST_CLASSES

QUOTA_RUN = r"""
import os, torch
from kvshield_sglang import plugin
plugin.load()
import jpype, servers
from fakes import MHAPool
from sglang.srt.managers.schedule_policy import PrefillAdder
import sglang.srt.mem_cache.allocator.paged as paged
if os.environ.get("PLANTED") == "no-quota-hook":
    PrefillAdder.add_one_req = PrefillAdder.add_one_req.__wrapped__
servers.publish_server_args(attention_backend="torch_native")
a = paged.PagedTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", MHAPool(64, 4), False)
policy = jpype.JClass("dev.kvshield.tenant.TenantPolicy")
a._j.pool().tenants().register("acme", policy.withQuota(4))  # 4 pages = 16 tokens
cache = servers.radix_cache(a)
r1, r2 = servers.request("r1", list(range(1, 7)), "acme"), servers.request("r2", list(range(11, 21)), "acme")
r3, r4 = servers.request("r3", list(range(21, 27)), "globex"), servers.request("r4", list(range(31, 61)), "acme")
try:
    with servers.single_rank():
        batch = servers.prefill(cache, [r1, r2, r3, r4])
except RuntimeError as e:
    print("step failed:", str(e).splitlines()[0])
else:
    print("admitted", [r.rid for r in batch.reqs])
    print("acme pages", a.tenant_owned_pages("acme"))
    print("r4", r4.to_finish.status_code if r4.to_finish else None, len(r4.origin_input_ids))
"""


def _run(tmp_path, **env):
    r = scenarios.run(scenarios.script(QUOTA_RUN), tmp_path, TEST_CLASSES, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64", **env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    return r.stdout


def test_over_quota_requests_wait_or_are_refused_and_the_step_allocates(jvm, tmp_path):
    out = _run(tmp_path)
    # r1 may take 3 of acme's 4 pages (6 tokens + 4 new); r2 (10 tokens) would need 4 more: it waits; r3 is another
    # tenant's; r4 (30 tokens) can never fit acme's quota: refused (400), a one-token request that waits too
    assert "admitted ['r1', 'r3']" in out, out
    assert "acme pages 2" in out and "r4 400 1" in out, out


def test_twin_without_the_quota_hook_fails_the_prefill_step(jvm, tmp_path):
    out = _run(tmp_path, PLANTED="no-quota-hook")
    assert "step failed: Prefill out of memory" in out, out


CHUNKED_QUOTA_RUN = r"""
import os, types, torch
from kvshield_sglang import plugin
plugin.load()
import jpype, servers
from fakes import MHAPool
from sglang.srt.managers.schedule_policy import PrefillAdder
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.mem_cache.common import maybe_cache_unfinished_req
import sglang.srt.mem_cache.allocator.paged as paged
servers.publish_server_args(attention_backend="torch_native")
a = paged.PagedTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", MHAPool(64, 4), False)
policy = jpype.JClass("dev.kvshield.tenant.TenantPolicy")
a._j.pool().tenants().register("acme", policy.withQuota(4))  # 4 pages = 16 tokens
cache = servers.radix_cache(a)
x = servers.request("x", list(range(1, 13)), "acme", max_new_tokens=4)  # 12 + 4 tokens: 4 pages, the whole quota
y = servers.request("y", list(range(101, 109)), "acme", max_new_tokens=0)  # 8 tokens: 2 pages
def batch_of(adder):
    b = ScheduleBatch.init_new(adder.can_run_list, cache.req_to_token_pool, a, cache,
                               types.SimpleNamespace(vocab_size=100, is_encoder_decoder=False), False,
                               SpeculativeAlgorithm.from_string(None))
    b.prepare_for_extend()
    return b
with servers.single_rank():
    running = ScheduleBatch(reqs=[])
    adder = PrefillAdder(4, cache, a, running, 0.5, 10 ** 6, 8)
    x.init_next_round_input(cache)
    adder.add_one_req(x, has_chunked_req=False, truncation_align_size=None)
    print("pass1", [r.rid for r in adder.can_run_list], "chunked", adder.new_chunked_req is x)
    b1 = batch_of(adder)
    print("pass1 loc", b1.out_cache_loc.tolist())
    maybe_cache_unfinished_req(x, cache)
    print("acme pages after pass 1", a.tenant_owned_pages("acme"))
    adder = PrefillAdder(4, cache, a, running, 0.5, 10 ** 6, 8)
    x.init_next_round_input(cache)
    adder.add_chunked_req(x)
    y.init_next_round_input(cache)
    adder.add_one_req(y, has_chunked_req=True, truncation_align_size=None)
    print("pass2", [r.rid for r in adder.can_run_list])
    try:
        b = batch_of(adder)
        print("pass2 allocated; acme pages", a.tenant_owned_pages("acme"), "loc", b.out_cache_loc.tolist(), "prefix", [len(r.prefix_indices) for r in b.reqs])
    except RuntimeError as e:
        print("step failed:", str(e).splitlines()[0])
    if any(r is y for r in adder.can_run_list):
        # x finished its prefill (it decodes next, in the running batch); y, chunked by pass 2, continues
        maybe_cache_unfinished_req(y, cache)
        adder = PrefillAdder(4, cache, a, running, 0.5, 10 ** 6, 8)
        y.init_next_round_input(cache)
        adder.add_chunked_req(y)
        print("pass3", [r.rid for r in adder.can_run_list], "pool free pages", a.available_size() // 4)
        try:
            b = batch_of(adder)
            print("pass3 allocated; acme pages", a.tenant_owned_pages("acme"))
        except RuntimeError as e:
            print("step failed:", str(e).splitlines()[0])
    else:
        print("pass2 y waits; pool free pages", a.available_size() // 4)
"""


def test_a_tenant_quota_counts_its_chunked_requests_worst_case(jvm, tmp_path):
    """A request is admitted only if its tenant's quota holds its worst case beside the worst case of the tenant's
    running, chunked and already admitted requests. Tenant acme (quota 4 pages) has X (12 tokens + 4 new: all 4
    pages) in chunked prefill (8-token chunks); SGLang continues X through ``add_chunked_req``, never through
    ``add_one_req``, and X is not in the running batch. Y of acme must wait. Found by attack: the hook counted only
    the running batch, admitted Y, and the next pass's allocation answered None, so SGLang's prefill step raised
    "Prefill out of memory" for the whole batch."""
    r = scenarios.run(scenarios.script(CHUNKED_QUOTA_RUN), tmp_path, TEST_CLASSES, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    out = r.stdout
    assert "pass1 ['x'] chunked True" in out and "acme pages after pass 1 2" in out, out[-2000:]
    assert "step failed" not in out, (f"a quota made SGLang's batch allocation fail: {out[out.index('step failed'):].splitlines()[0]}"
                                      f"; pass 2 admitted: {[l for l in out.splitlines() if l.startswith('pass2')]}")
    # Y waits while X's worst case fills acme's quota (the pool itself has room: only the quota is short)
    assert "pass2 ['x']" in out and int(re.search(r"pass2 y waits; pool free pages (\d+)", out).group(1)) >= 2, out[-1500:]
