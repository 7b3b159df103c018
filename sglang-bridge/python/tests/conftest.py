"""One JVM per pytest process; the real SGLang (installed, or the source tree named by
``KVSHIELD_SGLANG_SOURCE``: see :mod:`sglang_source`) importable before any test module loads. A missing
SGLang fails the run (never a skip); other missing software skips, and fails under KVSHIELD_REQUIRE_DEPS=1 (CI)."""

import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import sglang_source  # noqa: E402

sglang_source.setup()

REQUIRE_DEPS = os.environ.get("KVSHIELD_REQUIRE_DEPS") == "1"
# The Java test classes hold a test-only ENCRYPT key source (XorTestSealerFactory); tenant-keys ships the real one.
TEST_CLASSES = os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", "target", "test-classes"))
TEST_SEALER = "dev.kvshield.bridge.XorTestSealerFactory"


def require_software(present, what):
    """Skips when ``what`` is missing, or fails when KVSHIELD_REQUIRE_DEPS=1 (so CI cannot pass by skipping)."""
    if not present:
        if REQUIRE_DEPS:
            pytest.fail(f"required software missing: {what} (KVSHIELD_REQUIRE_DEPS=1 turns this skip into a failure)",
                        pytrace=False)
        pytest.skip(f"software missing: {what}")


def require_module(name):
    try:
        return importlib.import_module(name)
    except ImportError as e:
        require_software(False, f"Python module {name} ({e}); install python3-{name.split('.')[0]}")


@pytest.fixture(scope="session")
def jvm():
    require_module("jpype")
    require_module("torch")
    from kvshield_sglang import runtime
    from kvshield_sglang.errors import JvmStartError

    os.environ["KVSHIELD_EXTRA_CLASSPATH"] = TEST_CLASSES
    try:
        return runtime.ensure_jvm()
    except JvmStartError as e:
        require_software(False, str(e))
