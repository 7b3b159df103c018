"""JVM start-up and the self-test, each in a fresh process (a JVM cannot restart in one)."""

import os
import shutil
import subprocess
import sys

import pytest

from conftest import require_module

PKG = os.path.join(os.path.dirname(__file__), "..", "kvshield_sglang")


def _run(code_or_module, env_extra, cwd, module=False):
    env = dict(os.environ, PYTHONPATH=cwd, **env_extra)
    args = [sys.executable, "-m", code_or_module] if module else [sys.executable, "-c", code_or_module]
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def isolated_pkg(tmp_path):
    """The package copied away from the source tree, so its package-relative jar search finds nothing."""
    require_module("jpype")
    shutil.copytree(PKG, tmp_path / "kvshield_sglang", ignore=shutil.ignore_patterns("__pycache__", "_runtime"))
    return str(tmp_path)


START = "from kvshield_sglang import runtime; runtime.ensure_jvm()"


def test_missing_jdk_says_what_was_searched(isolated_pkg, tmp_path):
    empty = tmp_path / "jvms"
    empty.mkdir()
    r = _run(START, {"KVSHIELD_JVM_ROOT": str(empty), "JAVA_HOME": str(tmp_path), "KVSHIELD_JAVA_HOME": ""}, isolated_pkg)
    assert r.returncode != 0
    assert "JvmStartError: no Java 25+ runtime found; searched:" in r.stderr
    assert f"JAVA_HOME={tmp_path} (no lib/server/libjvm.so)" in r.stderr


def test_old_jdk_is_refused(isolated_pkg, tmp_path):
    fake = tmp_path / "jdk17"
    (fake / "lib" / "server").mkdir(parents=True)
    (fake / "lib" / "server" / "libjvm.so").write_bytes(b"")
    (fake / "release").write_text('JAVA_VERSION="17.0.9"\n')
    r = _run(START, {"KVSHIELD_JVM_ROOT": str(tmp_path / "none"), "KVSHIELD_JAVA_HOME": str(fake), "JAVA_HOME": ""},
             isolated_pkg)
    assert f"KVSHIELD_JAVA_HOME={fake} (Java 17)" in r.stderr


def test_missing_jars_say_what_was_searched(isolated_pkg, tmp_path):
    r = _run(START, {"KVSHIELD_CLASSPATH": str(tmp_path)}, isolated_pkg)
    assert r.returncode != 0
    assert "JvmStartError: kvshield jars not found; searched: KVSHIELD_CLASSPATH=" in r.stderr
    assert "source tree" in r.stderr and "package bundle" in r.stderr


def test_self_test_prints_versions(jvm):
    here = os.path.join(os.path.dirname(__file__), "..")
    r = _run("kvshield_sglang.selftest", {}, here, module=True)
    assert r.returncode == 0, r.stderr
    assert "java.runtime: OpenJDK" in r.stdout or "java.runtime:" in r.stdout
    assert "kvshield.sglang-bridge: 0.1.0-SNAPSHOT" in r.stdout
    assert "kvshield.cuda-scrub: 0.1.0-SNAPSHOT" in r.stdout
    # NOTE: the bridge's JVM opens the JDK's ChaCha20 block function (runtime.JVM_ARGS): seals run at its speed
    assert "chacha20: jdk" in r.stdout
    assert "cuda: usable" in r.stdout or "cuda: not usable (host tensors only)" in r.stdout
    assert "kvshield self-test: ok" in r.stdout


def test_self_test_fails_without_jars(isolated_pkg, tmp_path):
    r = _run("kvshield_sglang.selftest", {"KVSHIELD_CLASSPATH": str(tmp_path)}, isolated_pkg, module=True)
    assert r.returncode == 1
    assert "kvshield self-test: FAILED: kvshield jars not found" in r.stderr


def test_self_test_reports_missing_native_access(jvm, tmp_path):
    here = os.path.join(os.path.dirname(__file__), "..")
    code = ("from kvshield_sglang import runtime, selftest; runtime.JVM_ARGS = (); import sys; sys.exit(selftest.main())")
    r = _run(code, {}, here)
    assert r.returncode == 1
    assert "native access is not enabled" in r.stderr
