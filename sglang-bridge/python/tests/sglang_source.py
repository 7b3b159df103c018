"""Makes the real SGLang importable for the tests: the installed package when there is one, else the
source tree named by ``KVSHIELD_SGLANG_SOURCE`` (the one setting; ``./kvshield test`` and ``.ci/run`` set it) (a checkout with ``python/sglang``; where it carries
``compat/stubs`` — this project's pinned snapshot ``../shared/sglang-upstream`` does — those import
shims for third-party packages and torch features missing on the test machine are used too).

Import it before any ``sglang`` module; every test process (pytest, the scenario worlds, upstream's own
unit tests) calls :func:`setup` first. Nothing else of SGLang is ever stood in for.

Shims of this file's own, beyond the tree's ``compat/`` set (each one bypasses, never edits, SGLang's code):

- ``sglang`` is registered as a bare package over ``<source>/python/sglang``: its ``__init__`` imports the
  frontend language API, which the runtime under test never uses and which cannot import here.
- ``sglang.test.test_utils`` is a module with the two names upstream's unit tests import from it
  (``CustomTestCase``, ``maybe_stub_sgl_kernel``): the real file imports the benchmark tools and HTTP clients.
- ``torch.Tensor.nbytes`` (torch 2's ``numel() * element_size()``), where torch lacks it: SGLang's
  ``MetadataBuffers.get_buf_infos`` reads it.
"""

import importlib.util
import os
import sys
import types
import unittest

import torch

ENV = "KVSHIELD_SGLANG_SOURCE"
# The SGLang modules kvshield hooks or subclasses: with the compat layer's lenient import (needed for
# modules they merely depend on), these must still load completely, or the import fails.
UNDER_TEST = (
    "sglang.srt.mem_cache.allocator.base", "sglang.srt.mem_cache.allocator.token",
    "sglang.srt.mem_cache.allocator.paged", "sglang.srt.mem_cache.allocation", "sglang.srt.mem_cache.common",
    "sglang.srt.mem_cache.radix_cache", "sglang.srt.mem_cache.unified_radix_cache",
    "sglang.srt.mem_cache.base_prefix_cache", "sglang.srt.mem_cache.registry", "sglang.srt.mem_cache.memory_pool",
    "sglang.srt.mem_cache.kv_cache_configurator", "sglang.srt.managers.schedule_batch",
    "sglang.srt.managers.schedule_policy", "sglang.srt.managers.scheduler", "sglang.srt.managers.tokenizer_manager",
    "sglang.srt.managers.io_struct", "sglang.srt.model_executor.model_runner", "sglang.srt.entrypoints.http_server",
    "sglang.srt.disaggregation.decode", "sglang.srt.disaggregation.prefill", "sglang.srt.disaggregation.utils",
    "sglang.srt.disaggregation.base.conn", "sglang.srt.disaggregation.common.conn",
    "sglang.srt.disaggregation.fake.conn", "sglang.srt.disaggregation.mooncake.conn",
)
_where = None


class SglangMissing(RuntimeError):
    """Neither an installed SGLang nor ``KVSHIELD_SGLANG_SOURCE``: the tests cannot run (never a skip)."""


def setup():
    """Makes ``import sglang.srt...`` load the real SGLang; returns where from (idempotent)."""
    global _where
    if _where is not None:
        return _where
    installed = importlib.util.find_spec("sglang")
    if installed is not None:
        _where = "installed " + os.path.dirname(installed.origin)
        return _where
    source = os.environ.get(ENV)
    if not source:
        raise SglangMissing(f"SGLang is not installed and {ENV} is not set: point {ENV} at an SGLang source tree"
                            " (the project's pinned one: ../shared/sglang-upstream) or install SGLang")
    source = os.path.abspath(source)
    package = os.path.join(source, "python", "sglang")
    if not os.path.isdir(os.path.join(package, "srt")):
        raise SglangMissing(f"{ENV}={source} holds no python/sglang/srt")
    stubs = os.path.join(source, "compat", "stubs")
    if os.path.isdir(stubs):
        os.environ.setdefault("SGLANG_COMPAT_LENIENT", "1")
        strict = {m for m in os.environ.get("SGLANG_COMPAT_STRICT_MODULES", "").split(",") if m}
        os.environ["SGLANG_COMPAT_STRICT_MODULES"] = ",".join(sorted(strict | set(UNDER_TEST)))
        if stubs not in sys.path:
            sys.path.insert(0, stubs)
        import sglang_compat  # noqa: F401  (the tree's shims; must precede every sglang import)
    if not hasattr(torch.Tensor, "nbytes"):
        torch.Tensor.nbytes = property(lambda t: t.numel() * t.element_size())
    pkg = types.ModuleType("sglang")
    pkg.__path__ = [package]
    pkg.__file__ = os.path.join(package, "__init__.py")
    sys.modules["sglang"] = pkg
    test_pkg = types.ModuleType("sglang.test")
    test_pkg.__path__ = [os.path.join(package, "test")]
    sys.modules["sglang.test"] = test_pkg
    utils = types.ModuleType("sglang.test.test_utils")
    utils.CustomTestCase = unittest.TestCase
    utils.maybe_stub_sgl_kernel = lambda *a, **k: None
    sys.modules["sglang.test.test_utils"] = utils
    _where = f"{ENV}={source}"
    return _where


def child_env(env=None):
    """The environment a subprocess needs to find the same SGLang (``setup`` runs there again)."""
    env = dict(os.environ if env is None else env)
    if os.environ.get(ENV):
        env[ENV] = os.path.abspath(os.environ[ENV])
    return env
