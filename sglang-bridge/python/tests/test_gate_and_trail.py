"""The every-rank gate, the settings and files it guards, and the COMPLIANCE audit trail, through the bridge on the
real SGLang: each case a defect found by attacking them, failing before its fix."""

import os
import re

import pytest

import scenarios
from conftest import TEST_CLASSES
from trail_tools import NamedRequest, audit_tool, serve_one, signing_keys

# A scheduler process started the way SGLang starts one: SGLang's own load_plugins() finds the plug-in by its entry
# point (a dist-info on the path) and swallows whatever load() raises; then the allocator is built from SGLang's module.
_PLUGINS_LOADED = """
import argparse, os, sys, torch
sys.path.insert(0, os.environ["DIST"])
from fakes import MHAPool
from sglang.srt.plugins import load_plugins
load_plugins()
"""
# The scheduler built on ``args`` (its real __init__ stops at its first use of the bare arguments), then the allocator.
_SCHEDULER_THEN_ALLOCATOR = """
from sglang.srt.managers.scheduler import Scheduler
import sglang.srt.mem_cache.allocator.paged as paged
try:
    try:
        Scheduler.__init__(Scheduler.__new__(Scheduler), args, None, 0, 0, 0, 0, 0, 0, 0)
    except (AttributeError, TypeError):
        pass
    a = paged.PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False)
    print("ALLOC", type(a).__module__)
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""
SCHEDULER = _PLUGINS_LOADED + """
from sglang.srt.entrypoints import http_server
print("GATE", hasattr(http_server._wait_and_warmup, "__wrapped__"))
args = None
""" + _SCHEDULER_THEN_ALLOCATOR


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


# The launching process of SGLang's offline Engine (``sgl.Engine``; also the native gRPC and Rust-server launchers): every
# launcher starts the schedulers through ``Engine._launch_subprocesses``, which returns once each scheduler is ready
# (its allocator built and its rank reported); only the HTTP server's ``_wait_and_warmup`` comes after it. The
# schedulers themselves are not started here: the rank directory holds what they left (nothing: a rank whose plug-in
# never loaded, or whose SGLang built its own allocator). The rest of the launch is stood in for.
LAUNCHER = """
import types
from sglang.srt.entrypoints.engine import Engine
def launched(cls, server_args, init_tokenizer_manager_func, run_scheduler_process_func, run_detokenizer_process_func,
             port_args=None, placement_group=None):
    return "tokenizer", "templates", "ports", "schedulers", "watchdog", []
Engine._launch_subprocesses = classmethod(launched)  # the launch itself: needs a model and GPUs
from kvshield_sglang import plugin
plugin.load()
from kvshield_sglang.errors import RankNotProtectedError
args = types.SimpleNamespace(tp_size=2, dp_size=1, pp_size=1, enable_dp_attention=False, node_rank=0)
try:
    out = Engine._launch_subprocesses(args, None, None, None)
    print("SERVED", out[0])
except RankNotProtectedError as e:
    print("REFUSED", e)
"""


def test_an_engine_launch_is_gated_like_the_http_server(jvm, tmp_path, monkeypatch):
    """README: before serving, the launching process checks every expected rank and refuses to serve, naming each
    rank that lacks kvshield. The gate was hooked on ``http_server._wait_and_warmup`` only: SGLang's offline
    ``Engine`` (and ``SGLANG_RUST_SERVER``) never call it, so there a rank running without
    kvshield (its plug-in not loaded, SGLang's own allocator) served with no refusal."""
    from kvshield_sglang import ranks

    d = tmp_path / "ranks"
    d.mkdir()
    ranks.report("tp0-dp0-pp0", True, "this boot", directory=str(d), hooks={"all": "ok"})  # alive: the test process
    r = scenarios.run(scenarios.script(LAUNCHER), d, TEST_CLASSES)
    out = _lines(r)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "SERVED" not in out, "the Engine launched with rank tp1 never reporting kvshield: " + r.stdout
    assert "rank tp1-dp0-pp0 never reported kvshield active" in out["REFUSED"], out["REFUSED"]
    ranks.report("tp1-dp0-pp0", True, "this boot", directory=str(d), hooks={"all": "ok"})
    r = scenarios.run(scenarios.script(LAUNCHER), d, TEST_CLASSES)
    assert _lines(r).get("SERVED") == "tokenizer", r.stdout + r.stderr[-3000:]


@pytest.mark.parametrize("planted", ["readable", "link"])
def test_a_tenant_channel_key_others_can_read_or_plant_is_refused_naming_it(tmp_path, planted):
    """TenantChannel: the key that authenticates a request's tenant "never appears in logs, exceptions or repr"; README:
    on multi-node deployments point KVSHIELD_RANK_DIR at a shared owner-only directory. The key file found in the rank
    directory was read whatever its mode, owner or link (RecomputeChannel refuses a key others may read): a key
    another user could read, or had planted there beforehand, opened every envelope, so whoever held it could
    seal any tenant into a request's carrier field. Refused, naming the file; the tokenizer/scheduler hooks that read
    it then fail and the rank refuses to serve, naming them."""
    from kvshield_sglang.tenants import TenantChannel

    d = tmp_path / "ranks"
    d.mkdir()
    key = d / TenantChannel.KEY_FILE
    if planted == "readable":
        key.write_bytes(b"k" * TenantChannel.KEY_BYTES)
        key.chmod(0o644)
    else:
        elsewhere = tmp_path / "theirs.key"
        elsewhere.write_bytes(b"k" * TenantChannel.KEY_BYTES)
        elsewhere.chmod(0o600)
        key.symlink_to(elsewhere)
    with pytest.raises((ValueError, OSError)) as e:
        channel = TenantChannel.from_rank_dir(str(d))
        pytest.fail(f"opened {channel} over a key file others can read or planted: {planted}")
    assert str(key) in str(e.value) and "kkkk" not in str(e.value), str(e.value)
    key.unlink()
    TenantChannel.from_rank_dir(str(d))  # a key of its own, created owner-only
    assert oct(key.stat().st_mode & 0o777) == "0o600"


def test_a_rank_directory_others_can_write_is_refused_naming_it(tmp_path, monkeypatch):
    """README: point KVSHIELD_RANK_DIR at a shared owner-only directory. The gate believes whatever active record it finds
    there (a live pid and its start time): in a directory other users may write, any of them could vouch for a rank that
    runs without kvshield, or plant the tenant channel's key. Such a directory was used silently; now refused, naming it
    (plugin.load records it as the failed ``rank-dir`` hook: the rank refuses to serve)."""
    from kvshield_sglang import hooks, ranks

    d = tmp_path / "ranks"
    d.mkdir()
    d.chmod(0o777)
    monkeypatch.setenv(ranks.ENV_DIR, str(d))
    with pytest.raises(PermissionError, match=r"ranks is writable by users other than its owner \(mode 0o777\)"):
        ranks.ensure_dir()
    monkeypatch.setattr(hooks, "_RESULTS", {})
    assert hooks.attempt("rank-dir", ranks.ensure_dir) is None and "rank-dir" in hooks.failed()[0]
    d.chmod(0o700)
    assert ranks.ensure_dir() == str(d)


def test_a_root_key_pasted_into_its_setting_never_reaches_the_error(jvm):
    """Promise: key material never reaches logs, toString, metrics or exceptions. KVSHIELD_ROOT_KEY takes file:PATH,
    fd:N or ephemeral; an operator who pasted the key itself there (as other tools take it) got it echoed verbatim in
    the refusal, which SGLang's scheduler logs. The refusal names the forms and the value's length, never the value."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import KvShieldError

    key = "q7ZKVSHIELDROOTKEYb64xW3rP9mN2vL8cT5yH1jF4gD6sA0eU="
    for spec in (key, "hex:" + key):
        with pytest.raises(KvShieldError) as e:
            PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                        kvshield_settings={"level": "ENCRYPT", "rootKey": spec, "advertisedContextTokens": 16})
        assert "rootKey must be file:PATH, fd:N or ephemeral" in str(e.value), str(e.value)
        assert "KVSHIELDROOTKEY" not in str(e.value), str(e.value)


@pytest.mark.parametrize("level", ["NONE", "ZERO"])
def test_exposure_over_a_bridge_trail_names_the_request_that_received_another_tenants_page_unprotected(jvm, tmp_path,
                                                                                                        level):
    """Bridge README: a bridge trail holds no reads, so "`audit exposure` over it answers from what the pool handed out
    (a page another tenant received unprotected)". Acme's request releases two pages; globex's request is handed the
    same two pages next. Under NONE nothing scrubbed them: globex's request received acme's KV and is the one affected
    request; under ZERO they were scrubbed first: none is. The query named nobody in both cases while it judged reads
    only (the bridge records every allocation as written whole by its new owner); a bridge trail says it holds no
    reads, so hand-outs are judged as reads (design note 54)."""
    import json

    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    key, _ = signing_keys(tmp_path)
    trail = tmp_path / "trail"
    a = PagedTokenToKVPoolAllocator(8, 4, torch.float32, "cpu", MHAPool(8, 4), False, kvshield_settings=dict(
        level=level, advertisedContextTokens=8, auditSigningKey=str(key), auditDir=str(trail)))
    first, second = NamedRequest("acme-request"), NamedRequest("globex-request")
    serve_one(a, first, "acme")
    serve_one(a, second, "globex")
    globex = a.request_id(second)
    a.close()
    status, out, err = audit_tool("exposure", "--json", str(trail))
    assert status == 0, err
    exposed = [(e["tenant"], e["request"], e["sourceTenants"]) for e in json.loads(out)["exposed"]]
    expected = [("globex", globex, ["acme"])] if level == "NONE" else []
    assert exposed == expected, f"level {level}: audit exposure named {exposed}, expected {expected}"


# A scheduler process whose SGLang's paged allocator takes another constructor: the `allocators` hook cannot swap it.
BROKEN_ALLOCATOR = """
import torch
import sglang.srt.mem_cache.allocator.paged as paged
class Reshaped(paged.PagedTokenToKVPoolAllocator):
    def __init__(self, size, dtype, page_size, device, kvcache, need_sort):  # this SGLang's order differs
        super().__init__(size, page_size, dtype, device, kvcache, need_sort)
paged.PagedTokenToKVPoolAllocator = Reshaped
from kvshield_sglang import plugin
plugin.load()
from sglang.srt.managers.scheduler import Scheduler
try:
    Scheduler.__init__(Scheduler.__new__(Scheduler), None, None, 0, 0, 0, 0, 0, 0, 0)
except (AttributeError, TypeError):
    pass
from fakes import MHAPool
a = paged.PagedTokenToKVPoolAllocator(16, torch.float32, 4, "cpu", MHAPool(16, 4), False)
print("SERVING", type(a).__module__)
"""


def test_a_rank_whose_allocator_hook_failed_stops_naming_it(jvm, tmp_path):
    """README: "a rank with a failed hook also stops its scheduler, naming the hook", and its record names it. That
    stop ran only when kvshield's allocator was built: when the `allocators` hook itself failed, SGLang's own allocator
    was built, so the scheduler went on, and no record named the hook (the HTTP gate said only that the rank never
    reported, "plugin not loaded in that process?")."""
    import json

    d = tmp_path / "ranks"
    d.mkdir()
    r = scenarios.run(scenarios.script(BROKEN_ALLOCATOR), d, TEST_CLASSES, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="16")
    assert "SERVING" not in r.stdout, "the rank went on with " + r.stdout + r.stderr[-2000:]
    assert r.returncode != 0 and "hooks not installed: allocators: HookError" in r.stderr, r.stderr[-3000:]
    record = json.loads((d / "rank-tp0-dp0-pp0.json").read_text())
    assert not record["active"] and record["problems"][0].startswith("allocators: HookError"), record


@pytest.mark.parametrize("target", ["missing-dir", "a-directory"])
def test_compliance_refuses_a_ship_target_that_cannot_take_a_checkpoint_naming_it(jvm, tmp_path, target):
    """README: KVSHIELD_AUDIT_SHIP `file:PATH` ships each signed checkpoint off the host, which is what makes the trail
    tamper-evident against the serving host (its own key signs it); bad settings fail closed naming the value. A
    `file:` target in a directory that does not exist (or a directory itself) was accepted: COMPLIANCE started and every
    checkpoint's shipping then failed with a warning while it served, leaving the trail rewritable undetected."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import KvShieldError

    key, _ = signing_keys(tmp_path)
    ship = tmp_path / "collector" / "checkpoints.log" if target == "missing-dir" else tmp_path
    trail = tmp_path / "trail"
    with pytest.raises(KvShieldError, match="auditShip target 'file:" + str(ship) + "' cannot be appended to"):
        PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False, kvshield_settings=dict(
            level="COMPLIANCE", advertisedContextTokens=16, auditSigningKey=str(key),
            auditDir=str(trail), auditShip=f"log,file:{ship}"))
    assert not trail.exists() or not list(trail.iterdir()), "a refused start left a trail"


def test_tenants_with_sglangs_rust_server_are_refused_naming_it(monkeypatch):
    """README: a request's tenant comes from the gateway's header or its API key, read in the HTTP process
    (TokenizerManager.generate_request, hooked) and sealed to the scheduler. With SGLANG_RUST_SERVER SGLang's embedded
    Rust tokenizer feeds the scheduler directly (request_receiver drains its ring): no hook reads a header there, so
    with tenants configured every tenant's requests ran as the default tenant (one tree namespace, one quota) and no
    hook failed. The tokenizer hook now refuses, naming the setting (the rank then refuses to serve)."""
    from kvshield_sglang import engine_hooks, hooks
    from kvshield_sglang.tenants import TenantResolver
    from sglang.srt.managers.tokenizer_manager import TokenizerManager

    stock = TokenizerManager.generate_request
    monkeypatch.setenv("SGLANG_RUST_SERVER", "1")
    with pytest.raises(hooks.HookError, match="SGLANG_RUST_SERVER is set"):
        engine_hooks.install_tokenizer_side(TenantResolver("X-Tenant", {}, "default"))
    assert TokenizerManager.generate_request is stock


def test_a_pools_trail_replaced_by_another_pools_copy_fails_verify(jvm, tmp_path):
    """README: `audit verify --shipped` "refuses a log rewritten after a checkpoint left the host, and an older boot's
    complete trail put where the current one's should be"; the bridge writes one trail per pool
    (`audit-<pool>-r<rank>-boot<B>*`). Pool B's trail (with a refused cross-tenant free in it) deleted and pool A's
    complete trail copied under B's file names verified OK, with --shipped too (shipped checkpoints are compared per
    pool and rank, and the copy is A's), and `audit exposure` over "B's" files then reported A's events."""
    import shutil

    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    key, pub = signing_keys(tmp_path)
    trail, ship = tmp_path / "trail", tmp_path / "shipped.log"
    for pool, tenant, other in (("poolA", "acme", "globex"), ("poolB", "globex", "acme")):
        a = PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False, kvshield_settings=dict(
            level="COMPLIANCE", advertisedContextTokens=16, auditSigningKey=str(key),
            auditDir=str(trail), poolId=pool, auditShip=f"log,file:{ship}"))
        req = NamedRequest(f"{tenant}-request")
        a.set_plan([(req, tenant, 0, 8)])
        slots = a.alloc(8)
        a.clear_plan()
        with a.releasing(other, NamedRequest("intruder")):
            a.free(slots)  # refused: another tenant's request presents these pages
        with a.releasing(tenant, req):
            a.free(slots)
        a.end_step()
        a.close()
    (pool_a,) = trail.glob("audit-poolA-*.jsonl")
    (pool_b,) = trail.glob("audit-poolB-*.jsonl")
    status, out, _ = audit_tool("verify", "--pubkey", pub, "--shipped", ship, pool_b)
    assert status == 0, out
    shutil.copy(pool_a, pool_b)
    status, out, _ = audit_tool("verify", "--pubkey", pub, "--shipped", ship, pool_b)
    assert status == 2 and re.search(r"holds pool poolA(-open\d+)? rank 0's records", out), (status, out)
    status, out, _ = audit_tool("verify", "--pubkey", pub, "--shipped", ship, pool_a)
    assert status == 0, out


# Another plug-in's hook on a target kvshield wraps, applied as SGLang's load_plugins() applies every plug-in's
# registered hooks: after all plug-ins ran (HookRegistry.apply_hooks), so after kvshield's load().
DISPLACED = """
import os, torch
from kvshield_sglang import plugin
plugin.load()
from sglang.srt.plugins.hook_registry import HookRegistry, HookType
from sglang.srt.mem_cache import common
if os.environ["KIND"] == "replace":
    HookRegistry.register("sglang.srt.mem_cache.common.release_kv_cache", lambda req, tree_cache, *a, **k: None,
                          HookType.REPLACE)
elif os.environ["KIND"] == "replace-quota":
    HookRegistry.register("sglang.srt.managers.schedule_policy.PrefillAdder.add_one_req",
                          lambda self, req, *a, **k: None, HookType.REPLACE)
else:
    HookRegistry.register("sglang.srt.mem_cache.common.release_kv_cache", lambda orig, *a, **k: orig(*a, **k),
                          HookType.AROUND)
HookRegistry.apply_hooks()
from sglang.srt.managers.scheduler import Scheduler
import sglang.srt.mem_cache.allocator.paged as paged
from fakes import MHAPool
try:
    try:
        Scheduler.__init__(Scheduler.__new__(Scheduler), None, None, 0, 0, 0, 0, 0, 0, 0)
    except (AttributeError, TypeError):
        pass
    a = paged.PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False)
    print("ALLOC", type(a).__module__)
except Exception as e:
    print("REFUSED", type(e).__name__, e)
"""


@pytest.mark.parametrize("kind", ["replace", "around", "replace-quota"])
def test_a_hook_replaced_after_kvshield_installed_it_stops_the_rank_naming_it(jvm, tmp_path, kind):
    """README: a hook that cannot be installed stops that rank, naming it. SGLang applies every plug-in's registered hooks
    (HookRegistry.apply_hooks) after all plug-ins loaded, kvshield's included: another plug-in's REPLACE of
    mem_cache.common.release_kv_cache swapped kvshield's release wrapper out in every module, so a request's frees were
    no longer its own (refused as unattributed) and its leftovers were never released, while the rank reported every
    hook "ok" and served. Now the rank stops naming the hook and where. SGLang builds a REPLACE exactly as an AROUND
    (functools.wraps, ours as __wrapped__), so an AROUND is refused alike: whether ours still runs cannot be told."""
    d = tmp_path / "ranks"
    d.mkdir()
    r = scenarios.run(scenarios.script(DISPLACED), d, TEST_CLASSES, KIND=kind, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="16")
    out = _lines(r)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "ALLOC" not in out, f"the rank served with kvshield's release hook under another plug-in's {kind}: " + r.stdout
    where = "tenant-quota: PrefillAdder.add_one_req" if kind == "replace-quota" else \
        "release: sglang.srt.mem_cache.common.release_kv_cache"
    assert where + " was replaced or wrapped" in out["REFUSED"], out["REFUSED"]
    assert "hook_registry.py" in out["REFUSED"], out["REFUSED"]


# A scheduler process given SGLang's server args as its CLI parses them (``ServerArgs.add_cli_args``; the model-loading
# ``__post_init__`` left out), then built as in SCHEDULER.
SCHEDULER_OF_LAUNCHER = _PLUGINS_LOADED + """
from sglang.srt.server_args import ServerArgs
parser = argparse.ArgumentParser()
ServerArgs.add_cli_args(parser)
args = parser.parse_args(["--model-path", "m"] + os.environ["FLAGS"].split())
""" + _SCHEDULER_THEN_ALLOCATOR


@pytest.mark.parametrize("flags, why", [
    ("--smg-grpc-mode", "smg-grpc-servicer starts the schedulers with its own launcher"),
    ("--grpc-mode", "smg-grpc-servicer starts the schedulers with its own launcher"),
    ("--elastic-ep-backend mooncake", "elastic EP lets scheduler ranks join the running server"),
    ("--elastic-ep-join-mode recover", "elastic EP lets scheduler ranks join the running server"),
    ("", None)])
def test_a_launcher_past_the_serving_gate_is_refused_on_every_rank_naming_it(jvm, tmp_path, flags, why):
    """README: once every scheduler is ready (any launcher) the launching process checks every expected rank; tenants
    are sealed in TokenizerManager. ``--smg-grpc-mode`` (``--grpc-mode``, its deprecated alias) hands the launch to
    smg-grpc-servicer, which starts the schedulers with its own launcher (never ``Engine._launch_subprocesses`` or
    ``_wait_and_warmup``) and feeds them from its own request manager (never ``TokenizerManager``): the gate never ran
    and every tenant's request ran as the default tenant. Elastic EP (``--elastic-ep-backend``; a joining group's
    ``--elastic-ep-join-mode``) lets ranks join a running server (the data-parallel controller serves its worker ports
    to late joiners and dispatches to them) after its gate passed. Each rank served on kvshield's allocator. Every
    scheduler now refuses these at start, naming the setting, its rank recorded inactive; the HTTP launch still serves."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    r = scenarios.run(scenarios.script(SCHEDULER_OF_LAUNCHER), ranks, TEST_CLASSES, DIST=_dist(tmp_path), FLAGS=flags,
                      KVSHIELD_ADVERTISED_CONTEXT_TOKENS="16")
    out = _lines(r)
    assert r.returncode == 0, r.stderr[-3000:]
    if not flags:
        assert out.get("ALLOC") == "kvshield_sglang.allocator", r.stdout + r.stderr[-3000:]
        return
    flag = flags.split()[0]
    assert "ALLOC" not in out, f"a {flags} rank served on {out.get('ALLOC')}: " + r.stderr[-3000:]
    assert f"serving-gate: HookError: kvshield refuses to serve under {flag} " in out["REFUSED"], out["REFUSED"]
    assert why in out["REFUSED"], out["REFUSED"]
    record = (ranks / "rank-tp0-dp0-pp0.json").read_text()
    assert '"active": false' in record and flag in record and why in record, record


def test_a_rank_directory_shared_by_two_servers_vouches_for_neither_with_the_others_records(tmp_path, monkeypatch):
    """README: point KVSHIELD_RANK_DIR at a shared owner-only directory (multi-node); the gate refuses to serve unless
    every expected rank of this boot reported active. Two servers given one such directory (a PD deployment's prefill
    and decode servers sharing an env file) write their ranks' records under the same names: the decode server's gate
    found the prefill server's live, active tp0 record and served, though its own tp0 never reported (its plug-in not
    loaded). A rank's record names the server it serves (its multi-node rendezvous address, else host and port), and a
    gate takes only its own server's."""
    import types

    from kvshield_sglang import plugin, ranks
    from kvshield_sglang.errors import RankNotProtectedError

    d = tmp_path / "ranks"
    d.mkdir()
    monkeypatch.setenv(ranks.ENV_DIR, str(d))
    prefill = types.SimpleNamespace(tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False, port=30000)
    decode = types.SimpleNamespace(tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False, port=30001)
    ranks.report("tp0-dp0-pp0", True, "prefill's", hooks={"all": "ok"}, server=ranks.server_of(prefill))  # alive: us
    assert plugin.serving_gate(prefill, timeout_s=0)["tp0-dp0-pp0"]["detail"] == "prefill's"
    with pytest.raises(RankNotProtectedError) as e:
        plugin.serving_gate(decode, timeout_s=0)
        pytest.fail("the decode server served on the prefill server's rank record")
    assert (f"rank tp0-dp0-pp0 never reported for this server ({ranks.server_of(decode)}): its record in {d} is server"
            f" {ranks.server_of(prefill)}'s") in str(e.value), str(e.value)
    multi = types.SimpleNamespace(tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False, port=30001,
                                  dist_init_addr="10.0.0.1:5000")
    assert ranks.server_of(multi) == "dist-init-addr 10.0.0.1:5000"  # every node of one server names it alike


def test_a_shared_rank_directory_twin_a_gate_blind_to_the_server_serves(tmp_path, monkeypatch):
    """Twin: with the gate not told its server (the bug), the other server's record vouches for the decode server."""
    import socket
    import types

    from kvshield_sglang import plugin, ranks

    d = tmp_path / "ranks"
    d.mkdir()
    monkeypatch.setenv(ranks.ENV_DIR, str(d))
    ranks.report("tp0-dp0-pp0", True, "prefill's", hooks={"all": "ok"}, server=f"{socket.gethostname()}:30000")
    monkeypatch.setattr(ranks, "server_of", lambda server_args: None)
    decode = types.SimpleNamespace(tp_size=1, dp_size=1, pp_size=1, enable_dp_attention=False, port=30001)
    assert plugin.serving_gate(decode, timeout_s=0)["tp0-dp0-pp0"]["detail"] == "prefill's"
