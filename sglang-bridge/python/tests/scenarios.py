"""Scenario worlds run in a subprocess where SGLang's stand-in is importable: the world reports each
scenario as pass / fail (its oracle's assertion) / error (a crash), and the tests read the verdicts.
A planted-bug twin must end in "fail" with its oracle's message, never in "error"."""

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
            results[name] = ["fail", f"AssertionError: {e}"]
        except Exception as e:  # noqa: BLE001 (reported to the test, which names the scenario)
            results[name] = ["error", "".join(traceback.format_exception(e))[-2000:]]
    print(_MARK + json.dumps(results))


def run_world(module, rank_dir, extra_classpath, **env):
    """In the test's process: runs ``module.main()`` on the stand-in; returns {name: [status, message]}."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "stub_sglang"), os.path.dirname(HERE), HERE]),
               KVSHIELD_RANK_DIR=str(rank_dir), KVSHIELD_EXTRA_CLASSPATH=extra_classpath, **env)
    r = subprocess.run([sys.executable, "-c", f"import {module}; {module}.main()"], env=env, capture_output=True,
                       text=True, timeout=300, cwd=HERE)
    lines = [line for line in r.stdout.splitlines() if line.startswith(_MARK)]
    assert r.returncode == 0 and lines, r.stdout[-2000:] + r.stderr[-3000:]
    return json.loads(lines[-1][len(_MARK):])


def passes(results, name):
    status, message = results[name]
    assert status == "pass", f"{name}: {message}"


def fails(results, name, why):
    """A planted-bug twin: the scenario's oracle must catch it (an assertion, not a crash)."""
    status, message = results[name]
    assert status == "fail" and why in message, f"{name} should fail with {why!r}: {status} {message}"
