"""Sixth attack round: each test states the promise it attacks (README, docs/DESIGN-NOTES.md); where a docstring says
"observed", it is what the code did before its fix (the test failed then)."""

import os
import subprocess
import sys
import types

import pytest

from kvshield_sglang import buffers, plugin, ranks
from kvshield_sglang.errors import RankNotProtectedError


def _report_from_a_process_that_exits(directory, name):
    """A scheduler process of an earlier boot that reported its rank active, then exited."""
    code = ("import sys; from kvshield_sglang import ranks; "
            f"ranks.report({name!r}, True, 'earlier boot', directory={directory!r}, hooks={{'all': 'ok'}})")
    here = os.path.join(os.path.dirname(__file__), "..")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=here,
                   env=dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", "")))


def test_gate_refuses_a_rank_that_did_not_report_in_this_boot(tmp_path, monkeypatch):
    """README: "Before the server's warm-up, the launching process checks every expected rank ... and refuses
    to serve, naming each rank and what it lacks (or that it never reported)"; README known limits: on
    multi-node deployments point KVSHIELD_RANK_DIR at a shared owner-only directory (so it persists across
    restarts). A server restarted over the same rank directory, where rank tp1's plug-in never loaded this
    time (it never reports), must be refused naming tp1: the record tp1 left active in the earlier boot,
    written by a process that has since exited, must not vouch for this boot's tp1."""
    d = str(tmp_path / "ranks")
    os.makedirs(d)
    for name in (ranks.rank_name(0), ranks.rank_name(1)):
        _report_from_a_process_that_exits(d, name)  # the earlier boot: both ranks active
    # This boot: the launcher exports the same directory, tp0 reports active, tp1 never does.
    monkeypatch.setenv(ranks.ENV_DIR, d)
    assert ranks.ensure_dir() == d
    ranks.report(ranks.rank_name(0), True, "this boot", hooks={"all": "ok"})
    args = types.SimpleNamespace(tp_size=2, dp_size=1, pp_size=1, enable_dp_attention=False)
    with pytest.raises(RankNotProtectedError) as e:
        plugin.serving_gate(args, timeout_s=0.2)
    assert ranks.rank_name(1) in str(e.value)


def test_compliance_with_surrounding_whitespace_still_refuses_without_the_handoff_fix(jvm, monkeypatch):
    """disagg.check_handoff_fix: without SGLang's handoff-isolation fix, "under COMPLIANCE refuses (the hook is
    then recorded as failed and the rank does not serve) unless KVSHIELD_ALLOW_UNFIXED_HANDOFF=1". The level
    comes from KVSHIELD_LEVEL, which the Java settings read trimmed and case-folded: "COMPLIANCE " (a trailing
    space, as an env file leaves it) runs the pool at COMPLIANCE (it demands the signed audit trail's key). The
    plug-in's handoff-fix hook must then refuse as it does for "COMPLIANCE", naming the override."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang import disagg
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import KvShieldError, UnsupportedFeatureError

    monkeypatch.delenv(disagg.ALLOW_UNFIXED, raising=False)
    monkeypatch.setenv("KVSHIELD_LEVEL", "COMPLIANCE ")
    assert not disagg.has_handoff_fix(), "this snapshot's create_sender has only the KV-capacity check"
    # The pool reads the same setting as COMPLIANCE: it refuses to open without the audit signing key.
    with pytest.raises(KvShieldError, match="COMPLIANCE writes a signed audit trail"):
        PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", MHAPool(32, 4), False,
                                    kvshield_settings={"advertisedContextTokens": 32})
    # The plug-in's hook (installed as plugin.HOOKS' "handoff-fix") must refuse the same level.
    with pytest.raises(UnsupportedFeatureError, match="COMPLIANCE refuses to start"):
        plugin._install_disagg("check_handoff_fix")(None)


def test_compliance_with_an_empty_audit_directory_refuses_naming_it(jvm, tmp_path, monkeypatch):
    """README/BridgeSettings: COMPLIANCE writes its signed audit trail to the configured directory or refuses to
    start naming the setting; bad settings fail closed naming the value. An empty ``auditDir`` names no
    directory (the environment path already drops an empty KVSHIELD_AUDIT_DIR as unset, and COMPLIANCE then
    refuses): handed to the allocator's settings it must be refused too, not read as the process's working
    directory, where the compliance trail would silently land."""
    import torch

    from coverage_world import audit_keys
    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import KvShieldError

    key, _, _ = audit_keys()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    opened = None
    try:
        with pytest.raises(KvShieldError, match="auditDir"):
            opened = PagedTokenToKVPoolAllocator(
                32, 4, torch.float32, "cpu", MHAPool(32, 4), False,
                kvshield_settings={"level": "COMPLIANCE", "advertisedContextTokens": 32, "auditSigningKey": key,
                                   "auditDir": ""})
    finally:
        written = sorted(os.listdir(cwd))
    assert opened is None
    assert written == [], f"the COMPLIANCE trail went to the working directory: {written}"


def _holder(kind, tensor):
    import collections

    import torch

    if kind == "deque":
        return collections.deque([tensor])
    if kind == "set":
        return {tensor}
    if kind == "namespace":
        return types.SimpleNamespace(buffer=tensor)
    if kind == "nn-module":
        m = torch.nn.Module()
        m.register_buffer("cache", tensor)
        return m
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["deque", "set", "namespace", "nn-module"])
def test_a_slot_indexed_tensor_held_in_another_container_is_refused_naming_it(jvm, kind):
    """buffers.py / README: every tensor a KV pool instance holds must be registered, a view inside a registered
    buffer, empty or declared; "anything else is refused naming it" (unknown-tensor:Class.attribute). A real
    SGLang MHATokenToKVPool (the tests' CPU subclass, enumerated as that class) holding one more KV-shaped tensor,
    one row per token slot like k_buffer, must stop the allocator at start naming the attribute. Held in a deque,
    a set, a SimpleNamespace or a torch.nn.Module (not a list, tuple, dict or SGLang object), it is never seen:
    the allocator opens, registers the 4 K/V buffers only, and that tensor's bytes are never scrubbed."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import UnsupportedFeatureError

    pool = MHAPool(32, 4)
    rows = pool.k_buffer[0].shape[0]
    pool.extra_kv = _holder(kind, torch.ones(rows, 4))  # one KV row per token slot, as k_buffer[i]
    _, refusals = buffers.cover([pool], 32, 4)
    assert any("extra_kv" in r.where for r in refusals), f"no refusal names extra_kv: {refusals}"
    with pytest.raises(UnsupportedFeatureError, match="extra_kv"):
        PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})


def test_released_page_of_a_namespace_held_kv_tensor_is_not_left_with_its_bytes(jvm):
    """Scrub at ZERO (README): a released page's bytes are zero before another tenant gets it, in every tensor
    that holds KV at the pool's slots. The same pool as above, its extra KV tensor held in a SimpleNamespace:
    the allocator opens (it should have refused), and after t1's page is released and the step ends, K/V read
    back zero at its slots while the extra tensor still holds t1's bytes there."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    pool = MHAPool(32, 4)
    rows = pool.k_buffer[0].shape[0]
    extra = torch.zeros(rows, 4)
    pool.extra_kv = types.SimpleNamespace(buffer=extra)
    try:
        a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                        kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    except Exception as e:  # the promised outcome: refused at start, naming it
        assert "extra_kv" in str(e)
        return
    a.set_plan([("A", "t1", 0, 4)])
    slots = a.alloc(4)
    a.clear_plan()
    for b in pool.buffers():
        b[slots] = 7.0
    extra[slots] = 7.0
    with a.releasing("t1", "A"):
        a.free(slots)
    a.end_step()
    assert all(bool((b[slots] == 0).all()) for b in pool.buffers()), "K/V were not scrubbed"
    assert bool((extra[slots] == 0).all()), f"t1's KV bytes survive release in extra_kv: {extra[slots].tolist()}"


@pytest.mark.parametrize("shape", ["list", "tuple"])
def test_a_retraction_cpu_copy_dropped_without_reload_is_zeroed(jvm, monkeypatch, shape):
    """SGLang's retraction offload (``Req.offload_kv_cache`` → ``get_cpu_copy``) copies a request's KV into host
    tensors; a reload (``load_cpu_copy``) zeroes them. A request aborted while retracted is never reloaded:
    SGLang drops the copy, and its host memory must not be freed holding the tenant's KV. Found by attack: the
    dropped copy kept t1's bytes; a seventh round found the pools whose copy is a dict (DSA) or a tuple
    (HybridLinearKVPool, emulated here over the MHA pool with its wrapper's shape) still keeping them."""
    import gc

    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    pool = MHAPool(32, 4)
    if shape == "tuple":
        inner = pool.get_cpu_copy
        pool.get_cpu_copy = lambda indices, mamba_indices=None: (inner(indices), None)
    a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    a.set_plan([("A", "t1", 0, 4)])
    slots = a.alloc(4)
    a.clear_plan()
    for b in pool.buffers():
        b[slots] = 7.0

    def flat(o):
        if o is None:
            return []
        return [o] if torch.is_tensor(o) else [t for v in (o.values() if isinstance(o, dict) else o) for t in flat(v)]

    copy = a.get_cpu_copy(slots)
    host = [t.detach() for t in flat(copy)]  # aliases of the copy's memory, to read it back after SGLang drops it
    assert host and all(bool((t == 7.0).all()) for t in host)
    with a.releasing("t1", "A"):  # retraction releases the request's pages
        a.free(slots)
    a.end_step()
    del copy  # the request is aborted while retracted: SGLang drops its copy, never reloading it
    gc.collect()
    left = sum(int((t != 0).sum()) for t in host)
    assert left == 0, f"{left} KV values of t1 stay in the dropped retraction copy's host memory"


@pytest.mark.parametrize("raw", ["unknown-pool:", "unknown-tensor:", "unknown-tensor:MHATokenToKVPool",
                                 "unknown-tensor:.k_buffer"])
def test_malformed_gap_names_are_refused_naming_them(raw):
    """README: KVSHIELD_ACCEPT_GAPS accepts memory kvshield does not cover "by name": the GAPS names,
    ``unknown-pool:Class``, ``unknown-tensor:Class.attribute`` or ``all``; an unknown name raises naming it
    (accepted_gaps: "unknown gap(s) ... in KVSHIELD_ACCEPT_GAPS"). A name with the prefix but no class, or no
    attribute, names no gap kvshield could ever report; it must be refused as the unknown names are, naming it.
    Observed: accepted silently (an operator's typo accepts nothing and is never reported)."""
    with pytest.raises(ValueError, match="KVSHIELD_ACCEPT_GAPS"):
        got = buffers.accepted_gaps({"accept_gaps": raw})
        pytest.fail(f"{raw!r} accepted as {got}")


@pytest.mark.parametrize("page_size", [0])
def test_a_zero_page_size_is_refused_naming_it(jvm, page_size):
    """Fail closed with named values: a bad setting raises naming the value. A page size of 0 must be refused as
    a page size, naming it (as a negative one is: "pageSizeTokens must be in [1, 4096]: pageSizeTokens=-4", and
    as ``resize`` names "a positive multiple of page_size"). Observed: a bare ZeroDivisionError ("integer modulo
    by zero") from the allocator's own size check, naming nothing."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    with pytest.raises((ValueError, KeyError, TypeError, ArithmeticError, RuntimeError)) as e:
        PagedTokenToKVPoolAllocator(32, page_size, torch.float32, "cpu", MHAPool(32, 4), False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    msg = str(e.value)
    assert "page_size" in msg and str(page_size) in msg and not isinstance(e.value, ZeroDivisionError), (
        f"{type(e.value).__name__}: {msg}")
