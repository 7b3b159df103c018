"""Scheduler-level scenarios on the real SGLang (:mod:`scheduler_world`): SGLang's own scheduler loop over a
real KV pool, request-to-token pool and tree cache, on stock SGLang and on SGLang with kvshield's plug-in
loaded, two tenants interleaved, every live request's KV re-read after every step.

Both sides run in their own process (the plug-in replaces SGLang's classes process-wide), side by side.
Stock SGLang is the baseline: with no attack it finishes every request and leaks nothing. Each oracle has
a planted-bug twin that must make it fail: the stock allocator under a stale free (isolation and leak), a
driver that skips its re-read (the re-read meta-check), a workload that never chunks, hits a prefix or
evicts (the checks that the main runs take those paths), an allocator that drops a free (leak) or hides
its memory (stall), a planning hook that misses one step (unattributed pages), same-rid requests that never overlap (the scenario's own premise), SGLang releases
that forget a request's KV on abort mid-prefill and on retraction (leak), a prefill/decode transport that
reports a transfer done without writing its last page (isolation), kvshield at level NONE (residue on
fresh pages)."""

import threading

import pytest

import scenarios
import scheduler_world as sw
from conftest import TEST_CLASSES

SIDES = ("stock", "kvshield")
MAIN = [f"main-{cache}-p{page}" for cache, page in sw.CONFIGS]
STALE = [f"stale-{mode}-{cache}-p{page}" for mode, configs in sw.STALE_FREE.items() for cache, page in configs]
ATTACKS = ["same-rid-unified-p4", "same-rid-chunk-p1", "abort-mid-prefill-radix-p4", "abort-mid-prefill-chunk-p1",
           "retraction-unified-p1", "retraction-chunk-p4"]
PD = ["pd-decode-chunk-p1", "pd-decode-chunk-p4", "pd-retraction-chunk-p4"]


@pytest.fixture(scope="module")
def worlds(jvm, tmp_path_factory):
    """``{side: {scenario: [status, message], "__metrics__": {...}}}``; both sides' processes at once."""
    results, errors = {}, []

    def go(side):
        try:
            results[side] = scenarios.run_world("scheduler_world", tmp_path_factory.mktemp(side), TEST_CLASSES,
                                                SCHEDULER_WORLD_SIDE=side, KVSHIELD_TENANT_HEADER=sw.TENANT_HEADER)
        except AssertionError as e:  # the process itself failed: its output is the message
            errors.append(f"{side}: {e}")

    threads = [threading.Thread(target=go, args=(side,)) for side in SIDES]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, "\n".join(errors)
    return results


@pytest.mark.parametrize("name", MAIN)
def test_stock_sglang_finishes_every_request_and_leaks_nothing(worlds, name):
    scenarios.passes(worlds["stock"], name)


@pytest.mark.parametrize("name", MAIN)
def test_kvshield_finishes_every_request_leaks_nothing_and_keeps_tenants_apart(worlds, name):
    scenarios.passes(worlds["kvshield"], name)


@pytest.mark.parametrize("name", STALE)
def test_kvshield_stale_free_of_a_finished_requests_slots_leaves_the_live_tenant_its_bytes(worlds, name):
    scenarios.passes(worlds["kvshield"], name)


@pytest.mark.parametrize("name", STALE)
def test_twin_stock_allocator_under_the_stale_free_hands_a_live_tenants_pages_to_another(worlds, name):
    scenarios.fails(worlds["stock"], name, "isolation")
    scenarios.fails(worlds["stock"], name, "leak")


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", ATTACKS)
def test_same_rid_abort_mid_prefill_and_retraction(worlds, side, name):
    scenarios.passes(worlds[side], name)


@pytest.mark.parametrize("side", SIDES)
@pytest.mark.parametrize("name", PD)
def test_decode_server_prealloc_transfer_commit_and_decode(worlds, side, name):
    scenarios.passes(worlds[side], name)


@pytest.mark.parametrize("name,why", [
    ("twin-skip-reread", "re-read"),
    ("twin-workload-takes-no-path", "eviction"),
    ("twin-workload-takes-no-path", "prefix hits"),
    ("twin-workload-takes-no-path", "chunked prefill"),
    ("twin-drops-a-free", "leak"),
    ("twin-hides-memory", "stall"),
    ("twin-same-rid-never-concurrent", "same rid"),
    ("twin-abort-mid-prefill-unreleased", "leak"),
    ("twin-retraction-unreleased", "leak"),
    ("twin-pd-transport-drops-last-page", "isolation"),
])
def test_twin_planted_bug_is_caught_by_its_oracle(worlds, name, why):
    scenarios.fails(worlds["stock"], name, why)


def test_twin_kvshield_at_level_none_leaves_another_tenants_bytes_on_fresh_pages(worlds):
    scenarios.fails(worlds["kvshield"], "twin-level-none-residue", "residue")


def test_twin_kvshield_with_a_step_planned_by_nobody_allocates_unattributed_pages(worlds):
    scenarios.fails(worlds["kvshield"], "twin-skips-one-plan", "unattributed")


def test_both_sides_ran_the_same_scenarios_on_the_same_schedule(worlds):
    """The sides differ only in the allocator: with no attack, SGLang schedules the same steps over both."""
    stock, ours = worlds["stock"]["__metrics__"], worlds["kvshield"]["__metrics__"]
    for name in MAIN + ATTACKS + PD:
        assert name in stock and name in ours, f"{name} did not run on both sides"
        if ours[name]["finished"] == ours[name]["total"] and not ours[name]["stalled"]:
            assert stock[name]["steps"] == ours[name]["steps"], (name, stock[name]["steps"], ours[name]["steps"])
