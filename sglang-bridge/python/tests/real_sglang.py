"""The real upstream SGLang (``../shared/sglang-upstream``, pinned) made importable here, per its
``compat/README.md``: third-party stand-ins on the path, torch-1.13 shims, lenient import of the
SGLang modules the code under test only depends on, ``sglang`` registered as a bare package.

:func:`run_world` runs a scenario world (see ``scenarios.py``) in a subprocess on it, so the
pytest process never imports SGLang (other tests rely on its absence).
"""

import json
import os
import subprocess
import sys
import types

from scenarios import _MARK

HERE = os.path.dirname(os.path.abspath(__file__))
UPSTREAM = os.environ.get("KVSHIELD_SGLANG_UPSTREAM") or os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "..", "shared", "sglang-upstream"))
# The SGLang modules whose classes the tests build: they must import fully.
STRICT = ("sglang.srt.mem_cache.memory_pool,sglang.srt.mem_cache.swa_memory_pool,sglang.srt.mem_cache.allocator.swa,"
          "sglang.srt.mem_cache.allocator.paged,sglang.srt.mem_cache.allocator.token,"
          "sglang.srt.mem_cache.kv_cache_configurator,sglang.srt.mem_cache.kv_cache_builder,"
          "sglang.srt.mem_cache.index_key_cache,sglang.srt.layers.quantization.fp4_kv_cache_quant_method")



def available():
    """Whether the upstream snapshot and its compat layer are here."""
    return os.path.isdir(os.path.join(UPSTREAM, "python", "sglang")) and os.path.isdir(os.path.join(UPSTREAM, "compat"))


def setup():
    """In the world's process, before any ``sglang`` import."""
    os.environ.setdefault("SGLANG_COMPAT_LENIENT", "1")
    os.environ.setdefault("SGLANG_COMPAT_STRICT_MODULES", STRICT)
    sys.path.insert(0, os.path.join(UPSTREAM, "compat", "stubs"))
    import sglang_compat  # noqa: F401  (shims torch 1.13 before SGLang loads)

    pkg = types.ModuleType("sglang")
    pkg.__path__ = [os.path.join(UPSTREAM, "python", "sglang")]
    sys.modules["sglang"] = pkg


def run_world(module, rank_dir, extra_classpath, **env):
    """Runs ``module.main()`` against the real SGLang; returns {scenario: [status, message]}."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]), KVSHIELD_RANK_DIR=str(rank_dir),
               KVSHIELD_EXTRA_CLASSPATH=extra_classpath, **env)
    r = subprocess.run([sys.executable, "-c", f"import real_sglang; real_sglang.setup(); import {module}; {module}.main()"],
                       env=env, capture_output=True, text=True, timeout=600, cwd=HERE)
    lines = [line for line in r.stdout.splitlines() if line.startswith(_MARK)]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(lines[-1][len(_MARK):])
