"""Runs every file of SGLang's ``test/registered/unit/mem_cache`` twice, with SGLang's own allocators and with
kvshield's swapped in (one process per file and mode, ``--timeout`` seconds each), and prints each test that
passes with SGLang's allocators but not with kvshield's. Not part of ``./kvshield test`` (minutes on an idle
machine); the four files that are (``test_upstream_unit.py``) run in seconds.

    KVSHIELD_SGLANG_SOURCE=../shared/sglang-upstream /usr/bin/python3 sglang-bridge/python/tests/upstream_unit_compare.py
"""

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

import sglang_source
from test_upstream_unit import HERE, TEST_CLASSES, _source_dir


def outcomes(xml):
    out = {}
    if not os.path.exists(xml):
        return out
    for case in ET.parse(xml).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        status = "fail" if bad is not None else "skip" if case.find("skipped") is not None else "pass"
        out[f"{case.get('classname').lstrip('.')}.{case.get('name')}"] = (status, "" if bad is None else
                                                                          (bad.get("message") or "")[:300])
    return out


def run(path, swap, workdir, timeout):
    xml = os.path.join(workdir, f"{os.path.basename(path)}-{swap}.xml")
    env = dict(sglang_source.child_env(), PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]), KVSHIELD_SWAP=swap,
               KVSHIELD_EXTRA_CLASSPATH=TEST_CLASSES, KVSHIELD_RANK_DIR=workdir)
    try:
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "upstream_unit_plugin",
                        "--rootdir", workdir, "-c", os.devnull, f"--junitxml={xml}", path], env=env,
                       capture_output=True, timeout=timeout, cwd=HERE)
    except subprocess.TimeoutExpired:
        return None
    return outcomes(xml)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--timeout", type=int, default=300)
    args = p.parse_args()
    sglang_source.setup()
    folder = _source_dir()
    totals = {"0": 0, "1": 0}
    with tempfile.TemporaryDirectory() as workdir:
        for path in sorted(glob.glob(os.path.join(folder, "test_*.py"))):
            stock, ours = run(path, "0", workdir, args.timeout), run(path, "1", workdir, args.timeout)
            name = os.path.basename(path)
            if stock is None or ours is None:
                print(f"{name}: timed out ({'SGLang' if stock is None else 'kvshield'})")
                continue
            totals["0"] += sum(s == "pass" for s, _ in stock.values())
            totals["1"] += sum(s == "pass" for s, _ in ours.values())
            for test_id, (status, _) in sorted(stock.items()):
                if status == "pass" and ours.get(test_id, ("missing", ""))[0] != "pass":
                    print(f"{name}::{test_id}: {ours.get(test_id, ('missing', ''))}")
    print(f"passed with SGLang's allocators: {totals['0']}; with kvshield's: {totals['1']}")


if __name__ == "__main__":
    main()
