"""A tenant's page quota is a per-request outcome in SGLang's scheduler, never a failed batch allocation
(SGLang's ``allocation.py`` raises on an allocator's ``None``): SGLang's own ``PrefillAdder`` and
``ScheduleBatch.prepare_for_extend`` with kvshield's hook on ``add_one_req``. Twin: without the hook, SGLang
admits the over-quota request and its prefill step fails."""

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
