"""Attacks on the hook gate and the COMPLIANCE audit trail through the bridge, on the real SGLang."""

import os

import pytest

import scenarios
from conftest import TEST_CLASSES

# A scheduler process started the way SGLang starts one: SGLang's own load_plugins() finds the plug-in by its entry
# point (a dist-info on the path) and swallows whatever load() raises; then the allocator is built from SGLang's module.
SCHEDULER = """
import os, sys, torch
sys.path.insert(0, os.environ["DIST"])
from fakes import MHAPool
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.entrypoints import http_server
print("GATE", hasattr(http_server._wait_and_warmup, "__wrapped__"))
from sglang.srt.managers.scheduler import Scheduler
try:
    Scheduler.__init__(Scheduler.__new__(Scheduler), None, None, 0, 0, 0, 0, 0, 0, 0)
except (AttributeError, TypeError):
    pass
import sglang.srt.mem_cache.allocator.paged as paged
try:
    a = paged.PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False)
    print("ALLOC", type(a).__module__)
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


def _dist(tmp_path):
    d = tmp_path / "dist" / "kvshield-0.0.dist-info"
    d.mkdir(parents=True)
    (d / "METADATA").write_text("Metadata-Version: 2.1\nName: kvshield\nVersion: 0.0\n")
    (d / "entry_points.txt").write_text("[sglang.srt.plugins]\nkvshield = kvshield_sglang.plugin:load\n")
    return str(tmp_path / "dist")


def _lines(r):
    return {line.split(" ", 1)[0]: line.split(" ", 1)[1] for line in r.stdout.splitlines() if " " in line}


@pytest.mark.parametrize("content", [None, "{not json"])
def test_a_bad_tenant_setting_refuses_the_rank_not_serves_without_kvshield(jvm, tmp_path, content):
    """plugin.load: "never raises: every outcome is recorded"; README: a hook that cannot be installed stops the
    rank naming it. A KVSHIELD_API_KEY_MAP that is missing or not JSON made load() raise before any hook: SGLang
    swallowed it, the scheduler built SGLang's own allocator (no kvshield, no rank record) and the launcher had no
    serving gate: the server served unprotected."""
    keys = tmp_path / "keys.json"
    if content is not None:
        keys.write_text(content)
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    r = scenarios.run(scenarios.script(SCHEDULER), ranks, TEST_CLASSES, DIST=_dist(tmp_path),
                      KVSHIELD_API_KEY_MAP=str(keys), KVSHIELD_ADVERTISED_CONTEXT_TOKENS="16")
    out = _lines(r)
    assert r.returncode == 0, r.stderr[-3000:]
    assert out.get("GATE") == "True", r.stdout + r.stderr[-3000:]
    assert "ALLOC" not in out, f"rank served on {out.get('ALLOC')}: " + r.stderr[-3000:]
    assert "tenant-settings" in out["REFUSED"] and str(keys) in out["REFUSED"], out["REFUSED"]
    record = (ranks / "rank-tp0-dp0-pp0.json").read_text()
    assert '"active": false' in record and str(keys) in record, record
