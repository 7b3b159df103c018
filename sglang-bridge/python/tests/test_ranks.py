"""Active on every rank or not at all: fake multi-process ranks (one process per rank, as SGLang
spawns them) report through the rank directory; serving is refused naming the rank without kvshield."""

import os
import subprocess
import sys
import types

import pytest

from conftest import require_module

HERE = os.path.join(os.path.dirname(__file__), "..")
RANK = """
import sys, torch
sys.path.insert(0, {tests!r})
from fakes import FakeMHAPool
from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", FakeMHAPool(16, 4), False,
                            kvshield_settings={{"advertisedContextTokens": 16}})
"""


def _spawn_rank(name, rank_dir, with_kvshield):
    env = dict(os.environ, PYTHONPATH=HERE, KVSHIELD_RANK_DIR=rank_dir, KVSHIELD_RANK_NAME=name)
    code = RANK.format(tests=os.path.dirname(__file__)) if with_kvshield else "pass  # a rank whose plugin never loaded"
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_every_rank_active_or_refuse_naming_the_rank(jvm, tmp_path):
    from kvshield_sglang import plugin, ranks
    from kvshield_sglang.errors import RankNotProtectedError

    d = str(tmp_path)
    procs = [_spawn_rank("tp0-dp0-pp0", d, True), _spawn_rank("tp1-dp0-pp0", d, False)]
    for p in procs:
        assert p.wait(timeout=120) == 0, p.stderr.read()
    args = types.SimpleNamespace(tp_size=2, dp_size=1, pp_size=1)
    os.environ[ranks.ENV_DIR] = d
    try:
        with pytest.raises(RankNotProtectedError, match=r"refusing to serve: rank tp1-dp0-pp0 never reported kvshield"):
            plugin.serving_gate(args, timeout_s=0.2)
        ranks.report("tp1-dp0-pp0", False, "allocator class is SGLang's own PagedTokenToKVPoolAllocator", d)
        with pytest.raises(RankNotProtectedError, match="rank tp1-dp0-pp0 runs without kvshield: allocator class"):
            plugin.serving_gate(args, timeout_s=0.2)
        p = _spawn_rank("tp1-dp0-pp0", d, True)
        assert p.wait(timeout=120) == 0, p.stderr.read()
        records = plugin.serving_gate(args, timeout_s=0.2)
        assert sorted(records) == ["tp0-dp0-pp0", "tp1-dp0-pp0"]
        assert "PagedTokenToKVPoolAllocator level=ZERO" in records["tp1-dp0-pp0"]["detail"]
    finally:
        del os.environ[ranks.ENV_DIR]


def test_plugin_load_exports_rank_dir_for_children(monkeypatch):
    from kvshield_sglang import plugin, ranks

    monkeypatch.delenv(ranks.ENV_DIR, raising=False)
    plugin.load()
    d = os.environ[ranks.ENV_DIR]
    assert os.path.isdir(d)
    plugin.load()
    assert os.environ[ranks.ENV_DIR] == d
    out = subprocess.run([sys.executable, "-c", f"import os; print(os.environ[{ranks.ENV_DIR!r}])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == d


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
