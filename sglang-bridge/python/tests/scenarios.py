"""Scenario worlds and scripts run in a subprocess on the real SGLang (a fresh process each: the plug-in
replaces SGLang's classes process-wide). A world reports each scenario as pass / fail (its oracle's
assertion) / error (a crash), and the tests read the verdicts. A planted-bug twin must end in "fail" with
its oracle's message, never in "error"."""

import json
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
_MARK = "RESULTS "


def report(scenarios):
    """In the world's process: runs ``{name: (fn, kwargs)}`` and prints the verdicts on one line."""
    results = {}
    for name, (fn, kwargs) in scenarios.items():
        try:
            fn(**kwargs)
            results[name] = ["pass", ""]
        except AssertionError as e:
            at = traceback.extract_tb(e.__traceback__)[-1]
            results[name] = ["fail", f"AssertionError: {e} (at {os.path.basename(at.filename)}:{at.lineno})"]
        except Exception as e:  # noqa: BLE001 (reported to the test, which names the scenario)
            results[name] = ["error", "".join(traceback.format_exception(e))[-2000:]]
    print(_MARK + json.dumps(results))


def run(args, rank_dir, extra_classpath, **env):
    """In the test's process: ``python args...`` with SGLang importable (``sglang_source``), the package and
    the test helpers on the path, rank directory ``rank_dir``; returns the CompletedProcess."""
    import sglang_source

    env = dict(sglang_source.child_env(), PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]),
               KVSHIELD_RANK_DIR=str(rank_dir), KVSHIELD_EXTRA_CLASSPATH=extra_classpath, **env)
    return subprocess.run([sys.executable, *args], env=env, capture_output=True, text=True, timeout=300, cwd=HERE)


def script(code):
    """``-c`` arguments running ``code`` after the real SGLang was made importable."""
    return ["-c", "import sglang_source; sglang_source.setup()\n" + code]


def run_world(module, rank_dir, extra_classpath, **env):
    """In the test's process: runs ``module.main()`` on the real SGLang; returns {name: [status, message]}."""
    return _reported(run(script(f"import {module}; {module}.main()"), rank_dir, extra_classpath, **env), _MARK)


def run_reporting(code, mark, rank_dir, extra_classpath, **env):
    """In the test's process: runs ``code`` on the real SGLang (a 64-token advertised context unless ``env`` names
    one); ``code`` prints its findings as a line ``mark`` + JSON. Returns the last such line's JSON."""
    env.setdefault("KVSHIELD_ADVERTISED_CONTEXT_TOKENS", "64")
    return _reported(run(script(code), rank_dir, extra_classpath, **env), mark)


def _reported(r, mark):
    """The JSON after ``mark`` on the last such line of a child's stdout; asserts the child succeeded and printed one."""
    lines = [line for line in r.stdout.splitlines() if line.startswith(mark)]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-4000:]
    return json.loads(lines[-1][len(mark):])


def passes(results, name):
    status, message = results[name]
    assert status == "pass", f"{name}: {message}"


def fails(results, name, why):
    """A planted-bug twin: the scenario's oracle must catch it (an assertion, not a crash)."""
    status, message = results[name]
    assert status == "fail" and why in message, f"{name} should fail with {why!r}: {status} {message}"
