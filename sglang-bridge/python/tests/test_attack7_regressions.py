"""Seventh attack round: each test states the promise it attacks (README, docs/DESIGN-NOTES.md, docstrings)."""

import gc
import json
import os
import subprocess
import sys
import types

import pytest

from kvshield_sglang import ranks
from kvshield_sglang.errors import RankNotProtectedError


def _flat(o):
    import torch

    if torch.is_tensor(o):
        return [o]
    if o is None:
        return []
    if isinstance(o, dict):
        return [t for v in o.values() for t in _flat(v)]
    return [t for v in o for t in _flat(v)]


def test_a_dsa_retraction_copy_dropped_without_reload_is_zeroed(jvm, monkeypatch):
    """allocator.get_cpu_copy: "one SGLang drops without a reload (the request aborted while retracted) is zeroed
    when it is dropped, so its host memory is freed holding no KV". DSATokenToKVPool (a pool kvshield supports,
    buffers._dsa) returns its host copy as a dict {"kv": [...], "index_k": ...}, not a list; the finalizer is only
    attached to lists, so the dropped copy keeps the tenant's KV bytes in host memory."""
    import torch

    sys.path.insert(0, os.path.dirname(__file__))
    import coverage_world
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    pool = coverage_world.dsa()
    from sglang.srt.utils import current_platform
    monkeypatch.setattr(current_platform, "synchronize", lambda *a, **k: None)  # a CPU-only test host
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: None)
    a = PagedTokenToKVPoolAllocator(128, 64, torch.bfloat16, "cpu", pool, False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 128})
    a.set_plan([("A", "t1", 0, 64)])
    slots = a.alloc(64)
    a.clear_plan()
    for b in pool.kv_buffer:
        if b.numel():
            b[slots] = 7
    copy = a.get_cpu_copy(slots)
    host = [t.detach() for t in _flat(copy) if t.numel()]  # aliases of its memory: read back after SGLang drops it
    assert host and any(bool((t != 0).any()) for t in host), "the copy holds t1's KV"
    with a.releasing("t1", "A"):
        a.free(slots)
    a.end_step()
    del copy  # aborted while retracted: SGLang drops the copy without reloading it
    gc.collect()
    left = sum(int((t != 0).sum()) for t in host)
    assert left == 0, f"{left} KV values of t1 stay in the dropped DSA retraction copy's host memory"


def test_gate_refuses_an_earlier_boots_record_whose_pid_is_reused(tmp_path, monkeypatch):
    """ranks: "An active record whose writer ran on this host and has exited is an earlier boot's (a reused
    directory) and vouches for nobody"; README: the gate refuses a rank that never reported in this boot. The
    check asks only whether *some* process has the record's pid. PIDs are reused (in a restarted container they
    repeat exactly), so an earlier boot's record whose pid now belongs to an unrelated live process vouches for a
    rank whose plug-in never loaded this boot, and the gate passes."""
    d = str(tmp_path / "ranks")
    os.makedirs(d)
    here = os.path.join(os.path.dirname(__file__), "..")
    code = ("from kvshield_sglang import ranks; "
            f"ranks.report({ranks.rank_name(1)!r}, True, 'earlier boot', directory={d!r}, hooks={{'all': 'ok'}})")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=here,
                   env=dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", "")))
    path = os.path.join(d, f"rank-{ranks.rank_name(1)}.json")
    record = json.load(open(path, encoding="utf-8"))
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        record["pid"] = unrelated.pid  # this boot's OS handed the earlier writer's pid to an unrelated process
        with open(path, "w", encoding="utf-8") as f:
            json.dump(record, f)
        monkeypatch.setenv(ranks.ENV_DIR, d)
        ranks.report(ranks.rank_name(0), True, "this boot", hooks={"all": "ok"})
        with pytest.raises(RankNotProtectedError) as e:
            got = ranks.verify([ranks.rank_name(0), ranks.rank_name(1)], directory=d)
            pytest.fail(f"gate passed with tp1's earlier-boot record (pid reused): {sorted(got)}")
        assert ranks.rank_name(1) in str(e.value)
    finally:
        unrelated.kill()
        unrelated.wait()


def test_the_gap_name_a_refusal_names_for_a_tensor_in_a_set_is_accepted(jvm):
    """README / buffers.settle: a refusal ends "To run with this memory unprotected, set KVSHIELD_ACCEPT_GAPS=<gap>";
    setting exactly that must start the allocator with the gap accepted. The tensor scan now follows sets (paths
    ``attr{i}``), and the unknown-tensor name keeps that ``{i}``, which the new well-formedness check in
    accepted_gaps refuses: the operator's only documented way past the refusal raises "unknown gap(s)"."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import UnsupportedFeatureError

    pool = MHAPool(32, 4)
    pool.scratch = {torch.ones(5)}  # a tensor the pool holds in a set: memory kvshield has not enumerated
    settings = {"level": "ZERO", "advertisedContextTokens": 32}
    with pytest.raises(UnsupportedFeatureError) as e:
        PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False, kvshield_settings=dict(settings))
    hint = str(e.value).split("KVSHIELD_ACCEPT_GAPS=", 1)[1].split()[0]
    assert hint.startswith("unknown-tensor:MHAPool.scratch"), hint
    try:
        a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                        kvshield_settings=dict(settings, accept_gaps=hint))
    except ValueError as err:
        pytest.fail(f"the gap the refusal named ({hint!r}) is refused by KVSHIELD_ACCEPT_GAPS: {err}")
    assert a is not None


def test_a_pool_holding_a_self_referencing_list_is_refused_not_crashed(jvm):
    """buffers._tensors_of: "each object once" -- the scan guards objects against cycles but not the lists, deques
    and dicts it follows, so a pool holding a container that contains itself (a history list, a deque of pending
    work pointing back at its owner's list) recurses until RecursionError: start-up crashes with no named refusal
    (fail closed with named values). Promised: either the allocator starts (no tensor there) or a named
    UnsupportedFeatureError."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import UnsupportedFeatureError

    pool = MHAPool(32, 4)
    pool.history = []
    pool.history.append(pool.history)
    try:
        a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                        kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    except UnsupportedFeatureError as e:
        assert "history" in str(e)
        return
    except RecursionError:
        pytest.fail("start-up crashed with RecursionError scanning a self-referencing list the pool holds")
    assert a.page_size == 4


def test_a_finished_senders_count_does_not_take_a_reused_rooms_board_entry():
    """Rooms are "held by request state, never by garbage collection" (design note 14, disagg.LiveRooms), and
    LoopbackBoard.open publishes a sender's count "unless another *live* sender's count is". But the board holds
    counts weakly, and arm_sender makes every armed fake sender a reference cycle (sender.init -> armed_init ->
    the bound original init -> sender), so a finished request's sender, dropped by SGLang, stays on the board until
    the cyclic collector happens to run. A later request legitimately reusing the room (PREFILL_ROOMS lets it: the
    first one finished) then gets an unpublished count: its decode side reads the finished request's token count
    and the finished request's *tenant* for the room."""
    import torch

    from sglang.srt.disaggregation.fake import conn
    from kvshield_sglang import transport

    transport.install_fake(conn)
    mgr = types.SimpleNamespace(kv_args=types.SimpleNamespace(page_size=4))
    rows = types.SimpleNamespace(kvshield_coverage=torch.zeros((4, transport.ROW_WORDS), dtype=torch.int64))
    room = 918273

    def a_request(rid, tenant, n_pages):
        req = types.SimpleNamespace(rid=rid, origin_input_ids=list(range(4 * n_pages)), bootstrap_room=room)
        sender = conn.FakeKVSender(mgr, "127.0.0.1:1", room, [0], 0)
        req.disagg_kv_sender = sender
        assert transport.arm_sender(sender, req, rows, 4, 1024, tenant=tenant)
        sender.init(n_pages, 0)
        sender.send(list(range(n_pages)))
        return req

    was = gc.isenabled()
    gc.collect()
    gc.disable()  # the collector has not run between the two requests (it runs by allocation thresholds)
    try:
        a = a_request("A", "tenant-a", 1)
        del a  # request A finished; SGLang drops it and its sender
        b = a_request("B", "tenant-b", 3)
        assert transport.LOOPBACK.tenant(room) == transport.tenant_tag("tenant-b"), (
            f"room {room}'s board entry is the finished request A's (tenant tag {transport.LOOPBACK.tenant(room)},"
            f" {transport.LOOPBACK.sent(room)} tokens), not live request B's ({b.disagg_kv_sender._kvshield_sent.tokens}"
            " tokens)")
        assert transport.LOOPBACK.sent(room) == 12
    finally:
        if was:
            gc.enable()
        transport.LOOPBACK.forget(room)
