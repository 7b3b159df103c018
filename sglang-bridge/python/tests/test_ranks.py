"""Active on every rank or not at all: one process per scheduler rank, as SGLang spawns them, loads the
plug-in and builds its allocator inside SGLang's ``Scheduler.__init__`` (whose arguments name the rank);
each reports through the rank directory, with every hook's outcome; serving is refused naming the rank and
what it lacks."""

import json
import os
import subprocess
import sys
import types

import pytest

import scenarios
from conftest import TEST_CLASSES
from kvshield_sglang import plugin, ranks
from kvshield_sglang.errors import RankNotProtectedError

HERE = os.path.join(os.path.dirname(__file__), "..")
# A scheduler process: the plug-in loads (SGLang's load_plugins), SGLang calls Scheduler.__init__ with the
# process's ranks, and the allocator is built inside it. The real __init__ needs a whole server; it stops at
# its first use of the bare arguments, after the hook recorded the ranks, and the allocator is built then.
RANK = """
import os, torch
from fakes import MHAPool
from kvshield_sglang import plugin
if os.environ.get("BREAK") == "planning":  # this SGLang's planning function has another signature
    import sglang.srt.mem_cache.allocation as allocation
    allocation.alloc_for_decode = lambda batch_list, n: None
if os.environ.get("PLUGIN") == "1":
    plugin.load()
from sglang.srt.managers.scheduler import Scheduler
try:
    Scheduler.__init__(Scheduler.__new__(Scheduler), None, None, 0, {tp}, 0, {pp}, 0, 0, {dp})
except (AttributeError, TypeError):
    pass
import sglang.srt.mem_cache.allocator.paged as paged
if os.environ.get("PLUGIN") != "1":  # kvshield's class used without the plug-in: no hook is in place
    from kvshield_sglang import allocator as paged
a = paged.PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False)
print(type(a).__module__)
"""


def _rank(tmp_path, tp=0, dp=0, pp=0, **env):
    env.setdefault("PLUGIN", "1")
    return scenarios.run(scenarios.script(RANK.format(tp=tp, dp=dp, pp=pp)), tmp_path, TEST_CLASSES,
                         KVSHIELD_ADVERTISED_CONTEXT_TOKENS="16", **env)


def _records(tmp_path):
    return {f.name: json.loads(f.read_text()) for f in tmp_path.glob("rank-*.json")}


def test_each_rank_reports_every_hook_and_names_itself_from_sglangs_arguments(jvm, tmp_path):
    r = _rank(tmp_path, tp=1, dp=1, pp=0, SGLANG_DP_RANK="7")  # the argument wins over the router's variable
    assert r.returncode == 0 and "kvshield_sglang.allocator" in r.stdout, r.stderr[-3000:]
    record = _records(tmp_path)["rank-tp1-dp1-pp0.json"]
    assert record["active"] and record["problems"] == [], record
    from kvshield_sglang import plugin

    assert [name for name, _ in plugin.HOOKS] == list(record["hooks"])
    assert set(record["hooks"].values()) == {"ok"}, record["hooks"]


def test_every_rank_active_or_refuse_naming_the_rank_and_what_it_lacks(jvm, tmp_path, monkeypatch):
    from kvshield_sglang import plugin, ranks
    from kvshield_sglang.errors import RankNotProtectedError

    # NOTE: a server's scheduler processes live while it gates; these stand-ins exit after reporting
    monkeypatch.setattr(ranks, "_writer_exited", lambda record: False)

    args = types.SimpleNamespace(tp_size=2, dp_size=2, pp_size=1, enable_dp_attention=False)
    for tp, dp in ((0, 0), (1, 0), (0, 1)):
        assert _rank(tmp_path, tp=tp, dp=dp).returncode == 0
    broken = _rank(tmp_path, tp=1, dp=1, BREAK="planning")
    assert broken.returncode != 0 and "hooks not installed: planning" in broken.stderr, broken.stderr[-2000:]
    os.environ[ranks.ENV_DIR] = str(tmp_path)
    try:
        with pytest.raises(RankNotProtectedError, match=r"rank tp1-dp1-pp0 runs without kvshield .*planning: "
                                                        r"HookError: sglang.srt.mem_cache.allocation.alloc_for_decode"):
            plugin.serving_gate(args, timeout_s=0.2)
        # The plug-in never loaded there (so nothing names the rank but the operator's override).
        assert _rank(tmp_path, tp=1, dp=1, PLUGIN="0", KVSHIELD_RANK_NAME="tp1-dp1-pp0").returncode == 0
        with pytest.raises(RankNotProtectedError, match=r"rank tp1-dp1-pp0 runs without kvshield .*plug-in: "
                                                        r"kvshield_sglang.plugin.load\(\) did not run"):
            plugin.serving_gate(args, timeout_s=0.2)
        (tmp_path / "rank-tp1-dp1-pp0.json").unlink()
        with pytest.raises(RankNotProtectedError, match=r"rank tp1-dp1-pp0 never reported kvshield active"):
            plugin.serving_gate(args, timeout_s=0.2)
        assert _rank(tmp_path, tp=1, dp=1).returncode == 0
        assert sorted(plugin.serving_gate(args, timeout_s=0.2)) == ["tp0-dp0-pp0", "tp0-dp1-pp0", "tp1-dp0-pp0",
                                                                  "tp1-dp1-pp0"]
    finally:
        del os.environ[ranks.ENV_DIR]


def test_expected_ranks_follow_sglangs_process_layout():
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

    from kvshield_sglang import ranks

    assert ranks.expected_ranks(2, 2, 1) == ["tp0-dp0-pp0", "tp1-dp0-pp0", "tp0-dp1-pp0", "tp1-dp1-pp0"]
    # With data-parallel attention SGLang starts tp_size schedulers and derives each one's dp rank.
    expected = [ranks.rank_name(t, compute_dp_attention_world_info(True, t, 4, 2)[2], 0) for t in range(4)]
    assert ranks.expected_ranks(4, 2, 1, dp_attention=True) == expected


def test_plugin_load_exports_rank_dir_for_children(tmp_path):
    code = ("import os, subprocess, sys\nos.environ.pop('KVSHIELD_RANK_DIR')\nfrom kvshield_sglang import plugin\n"
            "plugin.load()\nd = os.environ['KVSHIELD_RANK_DIR']\nplugin.load()\nassert os.environ['KVSHIELD_RANK_DIR'] == d\n"
            "out = subprocess.run([sys.executable, '-c', 'import os; print(os.environ[\"KVSHIELD_RANK_DIR\"])'],"
            " capture_output=True, text=True, check=True).stdout.strip()\nassert out == d and os.path.isdir(d), out\n")
    r = scenarios.run(scenarios.script(code), tmp_path, TEST_CLASSES)
    assert r.returncode == 0, r.stderr[-2000:]


def test_replace_everywhere_rebinds_names_imported_earlier():
    from kvshield_sglang import plugin

    class Stock:
        pass

    class Ours:
        pass

    mods = {"a": types.SimpleNamespace(Allocator=Stock), "b": types.SimpleNamespace(X=Stock, y=[1])}
    assert plugin.replace_everywhere({Stock: Ours}, mods) == 2
    assert mods["a"].Allocator is Ours and mods["b"].X is Ours


def test_launch_server_wrapper_execs_sglang_with_the_same_arguments():
    from kvshield_sglang import launch_server

    argv = ["--model-path", "m", "--tp", "2", "--page-size", "16"]
    assert launch_server.command(argv) == [sys.executable, "-m", "sglang.launch_server", *argv]


def test_entry_point_is_declared():
    text = open(os.path.join(HERE, "pyproject.toml"), encoding="utf-8").read()
    assert '[project.entry-points."sglang.srt.plugins"]' in text
    assert 'kvshield = "kvshield_sglang.plugin:load"' in text


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
