"""SGLang's own unit tests of its allocators and radix caches, run with kvshield's allocators swapped in
by the plug-in (every module's ``TokenToKVPoolAllocator``/``PagedTokenToKVPoolAllocator`` is kvshield's, as
in a server). Each test passes as it does with SGLang's own allocators, except where kvshield refuses an
unsafe call (:data:`REFUSED`, each with the error it must end in; listed in sglang-bridge/README.md) and the
one that needs an accelerator (:data:`NEEDS_ACCELERATOR`, an error with SGLang's own allocators too)."""

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import sglang_source
from conftest import TEST_CLASSES

HERE = os.path.dirname(os.path.abspath(__file__))
FILES = ("test_paged_free_segment.py", "test_radix_cache_unit.py", "test_session_unified_radix_cache.py",
         "test_radix_cache_slru_accuracy.py")
# test (class.name) -> text the failure must contain (each part, in its message or its traceback): kvshield refuses
# the call, SGLang's allocator accepts it.
_SECOND_FREE_REFUSED = ("RejectedFreeError: kvshield refused 1 page(s) of a free of 4 slots: free of page 1 ",
                        ">       alloc.free_segment(row, start_pos=0)")  # the test's line it fails at: the second free
REFUSED = {
    "TestSLRUAccuracy.test_eviction_mechanism":  # test_radix_cache_slru_accuracy.py
        # the test inserts made-up slot values (10, 20, 50, ...) into a cache over an 8-slot pool: the tree's
        # insert hands them to the cache's holds (and its eviction would free them); slots outside the pool
        ("adopt of slot 10 (index 0 of 2): outside the pool's slots [0, 9)",
         "self.cache.insert(InsertParams(key=frequent_key, value=frequent_val))"),  # the test's first insert
    # test_paged_free_segment.py: free(row) then free_segment(row) of the same page in one free group, debug mode on.
    # A double free: kvshield refuses it at the second free (debug mode raises its RejectedFreeError, an
    # AssertionError, there), before the test's assertRaises around free_group_end that SGLang's check trips.
    "TestFreeSegment.test_group_end_debug_assert_catches_cross_call_double_free": _SECOND_FREE_REFUSED,
    "TestFreeSegment.test_group_end_debug_assert_covers_release_pages": _SECOND_FREE_REFUSED,  # with need_sort
}
NEEDS_ACCELERATOR = {"TestRadixCache.test_memory_allocated": "No accelerator"}  # test_radix_cache_unit.py


def _source_dir():
    """SGLang's own unit tests: in the source tree ``KVSHIELD_SGLANG_SOURCE`` names (a package ships none)."""
    source = os.environ.get(sglang_source.ENV)
    return source and os.path.join(source, "test", "registered", "unit", "mem_cache")


def _run(tmp_path, swap):
    folder = _source_dir()
    assert folder and os.path.isdir(folder), (f"SGLang's unit tests are read from the source tree "
                                              f"{sglang_source.ENV} names; an installed SGLang ships none")
    xml = tmp_path / f"upstream-{swap}.xml"
    env = dict(sglang_source.child_env(), PYTHONPATH=os.pathsep.join([os.path.dirname(HERE), HERE]),
               KVSHIELD_SWAP=swap, KVSHIELD_EXTRA_CLASSPATH=TEST_CLASSES, KVSHIELD_RANK_DIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-p", "upstream_unit_plugin",
                        "--rootdir", str(tmp_path), "-c", os.devnull, f"--junitxml={xml}",
                        *[os.path.join(folder, f) for f in FILES]], env=env, capture_output=True, text=True,
                       timeout=600, cwd=HERE)
    outcomes = {}
    for case in ET.parse(xml).getroot().iter("testcase"):
        bad = case.find("failure") if case.find("failure") is not None else case.find("error")
        test_id = f"{case.get('classname').lstrip('.')}.{case.get('name')}"
        outcomes[test_id] = ("fail", (bad.get("message") or "") + "\n" + (bad.text or "")) if bad is not None else (
            ("skip", "") if case.find("skipped") is not None else ("pass", ""))
    return r, outcomes


def test_sglangs_own_unit_tests_pass_with_kvshields_allocators_swapped_in(jvm, tmp_path):
    r, outcomes = _run(tmp_path, "1")
    assert ("kvshield allocators swapped in: ['kvshield_sglang.allocator', 'kvshield_sglang.allocator']"
            in r.stdout), r.stdout[-3000:] + r.stderr[-3000:]
    assert len(outcomes) == 58, sorted(outcomes)
    for test_id, (status, message) in sorted(outcomes.items()):
        expected = REFUSED.get(test_id) or NEEDS_ACCELERATOR.get(test_id)
        if expected is None:
            assert status == "pass", f"{test_id}: {status} {message[:1500]}"
        else:
            parts = (expected,) if isinstance(expected, str) else expected
            assert status == "fail" and all(p in message for p in parts), \
                f"{test_id} should fail with {parts!r}: {status} {message[:3000]}"
    assert sum(status == "pass" for status, _ in outcomes.values()) == 58 - len(REFUSED) - len(NEEDS_ACCELERATOR)
