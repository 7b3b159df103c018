"""Finds a Java 25 runtime and the kvshield jars, and starts the JVM once per process.

JPype cannot restart a JVM in a process: :func:`ensure_jvm` starts it lazily, the first time a
scheduler process builds an allocator, and later calls reuse it.

Search order (first hit wins), each reported when nothing is found:

- Java: ``$KVSHIELD_JAVA_HOME``; the bundle's ``runtime/`` (``$KVSHIELD_RUNTIME``, then the
  package's ``_runtime/``); ``$JAVA_HOME``; ``$KVSHIELD_JVM_ROOT/*`` (default ``/usr/lib/jvm``). It must be Java 25+.
- Jars: ``$KVSHIELD_CLASSPATH`` (a ``:``-separated list of jars or directories of jars); the
  bundle's ``lib/``; the source tree's ``sglang-bridge/target`` (``*.jar`` + ``lib/*.jar``).
- Plus ``$KVSHIELD_EXTRA_CLASSPATH`` (same form), appended: backends and key sources found by name
  or class name (cuda-scrub, tenant-keys).
- JPype's own ``org.jpype.jar`` (Debian puts it in ``/usr/share/java``).
"""

import glob
import os
import re
import threading

from .errors import JvmStartError

MIN_JAVA = 25
# NOTE: the opened JDK ChaCha20 block function (its intrinsic) and the Vector API module carry tenant-keys'
# fast ChaCha20 (about 3x and 2.2x the scalar path).
JVM_ARGS = ("--enable-native-access=ALL-UNNAMED", "--add-modules=jdk.incubator.vector",
            "--add-opens=java.base/com.sun.crypto.provider=ALL-UNNAMED")
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_SOURCE_TARGET = os.path.normpath(os.path.join(_PACKAGE_DIR, "..", "..", "target"))
_lock = threading.Lock()
_started = None


def _release_major(java_home):
    """The Java feature release of a runtime, read from its ``release`` file, or None."""
    try:
        with open(os.path.join(java_home, "release"), encoding="utf-8") as f:
            m = re.search(r'JAVA_VERSION="(\d+)', f.read())
        return int(m.group(1)) if m else None
    except OSError:
        return None


def _bundle_dirs():
    dirs = []
    if os.environ.get("KVSHIELD_RUNTIME"):
        dirs.append(("KVSHIELD_RUNTIME", os.environ["KVSHIELD_RUNTIME"]))
    dirs.append(("package bundle", os.path.join(_PACKAGE_DIR, "_runtime")))
    return dirs


def find_java_home():
    """Returns (java_home, libjvm path) of a Java 25+ runtime, or raises JvmStartError listing what was searched."""
    candidates = []
    if os.environ.get("KVSHIELD_JAVA_HOME"):
        candidates.append(("KVSHIELD_JAVA_HOME", os.environ["KVSHIELD_JAVA_HOME"]))
    for label, d in _bundle_dirs():
        candidates.append((label + " runtime", os.path.join(d, "runtime")))
    if os.environ.get("JAVA_HOME"):
        candidates.append(("JAVA_HOME", os.environ["JAVA_HOME"]))
    jvm_root = os.environ.get("KVSHIELD_JVM_ROOT", "/usr/lib/jvm")
    for d in sorted(glob.glob(os.path.join(jvm_root, "*", "")), reverse=True):
        candidates.append((jvm_root, d.rstrip("/")))
    searched = []
    for label, home in candidates:
        libjvm = os.path.join(home, "lib", "server", "libjvm.so")
        if not os.path.isfile(libjvm):
            searched.append(f"{label}={home} (no lib/server/libjvm.so)")
            continue
        major = _release_major(home)
        if major is None or major < MIN_JAVA:
            searched.append(f"{label}={home} (Java {major or 'unknown'})")
            continue
        return home, libjvm
    raise JvmStartError(
        f"no Java {MIN_JAVA}+ runtime found; searched: " + "; ".join(searched or ["nothing"])
        + ". Set KVSHIELD_JAVA_HOME, or build the bundle with `./kvshield bridge-runtime --out DIR`"
        " and set KVSHIELD_RUNTIME=DIR")


def _jars_in(d):
    return sorted(glob.glob(os.path.join(d, "*.jar")))


def find_classpath():
    """The kvshield jars, or raises JvmStartError listing what was searched."""
    searched = []
    env = os.environ.get("KVSHIELD_CLASSPATH")
    if env:
        jars = _expand(env)
        if _has_bridge(jars):
            return jars
        searched.append(f"KVSHIELD_CLASSPATH={env} (no sglang-bridge jar)")
    for label, d in _bundle_dirs():
        jars = _jars_in(os.path.join(d, "lib"))
        if _has_bridge(jars):
            return jars
        searched.append(f"{label} {os.path.join(d, 'lib')} (no sglang-bridge jar)")
    jars = _jars_in(_SOURCE_TARGET) + _jars_in(os.path.join(_SOURCE_TARGET, "lib"))
    if _has_bridge(jars) and any("allocator-api" in os.path.basename(j) for j in jars):
        return jars
    searched.append(f"source tree {_SOURCE_TARGET} and its lib/ (run `./kvshield test` or"
                    " `mvn -pl sglang-bridge -am package` first)")
    raise JvmStartError("kvshield jars not found; searched: " + "; ".join(searched))


def _expand(spec):
    jars = []
    for part in (spec or "").split(os.pathsep):
        if os.path.isdir(part) and not _jars_in(part):
            jars.append(part)  # a class directory
        elif os.path.isdir(part):
            jars.extend(_jars_in(part))
        elif os.path.isfile(part):
            jars.append(part)
    return jars


def _has_bridge(jars):
    return any(os.path.basename(j).startswith("sglang-bridge") for j in jars)


def _jpype_jar():
    import jpype
    for cand in [os.path.join(os.path.dirname(jpype.__file__), "..", "org.jpype.jar"), "/usr/share/java/org.jpype.jar"]:
        if os.path.isfile(cand):
            return os.path.normpath(cand)
    return None


def ensure_jvm():
    """Starts the JVM once (thread-safe) and returns a dict: java_home, classpath."""
    global _started
    with _lock:
        if _started is not None:
            return _started
        try:
            import jpype
        except ImportError as e:
            raise JvmStartError(f"JPype is not importable ({e}); install python3-jpype or JPype1") from None
        java_home, libjvm = find_java_home()
        classpath = find_classpath() + _expand(os.environ.get("KVSHIELD_EXTRA_CLASSPATH"))
        extra = _jpype_jar()
        if jpype.isJVMStarted():
            raise JvmStartError("a JVM was already started in this process by someone else; kvshield needs its own"
                                " class path and --enable-native-access and cannot restart it")
        jvm_args = tuple(JVM_ARGS)
        jpype.startJVM(libjvm, *jvm_args, classpath=classpath + ([extra] if extra else []), convertStrings=True)
        import jpype.imports  # noqa: F401  (Java packages importable as Python modules from here on)
        _started = {"java_home": java_home, "classpath": classpath, "jvm_args": jvm_args}
        return _started


def self_test():
    """Starts the JVM if needed and returns (version lines, problems) from Java's SelfTest."""
    info = ensure_jvm()
    import jpype
    SelfTest = jpype.JClass("dev.kvshield.bridge.SelfTest")
    lines = [str(v) for v in SelfTest.versions()]
    lines.append("classpath: " + os.pathsep.join(info["classpath"]))
    lines.append("jpype: " + jpype.__version__)
    lines.append("jvm args: " + " ".join(info["jvm_args"]))
    problems = [str(p) for p in SelfTest.problems()]
    # NOTE: a JVM created through JNI reports native access as enabled once it warned about it, so
    # the flag the JVM was started with is checked here as well.
    if "--enable-native-access=ALL-UNNAMED" not in info["jvm_args"]:
        problems.append("native access is not enabled: the JVM was started without --enable-native-access=ALL-UNNAMED")
    return lines, problems
