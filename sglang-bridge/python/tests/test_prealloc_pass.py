"""The decode side's preallocation pass as SGLang runs it: kvshield reserves exactly what SGLang preallocates for a
request (a PD rebootstrap's input and output so far), and a pass a refused reservation interrupts is rebuilt from
every request SGLang preallocated in it. Each scenario (``prealloc_pass_world.py``) runs in a subprocess on the real
SGLang; each twin plants its defect back and must fail. Docstrings: the promise, what happened before the fix, the
severity and the cause."""

import pytest

from conftest import TEST_CLASSES
from scenarios import fails, passes, run_world


@pytest.fixture(scope="module")
def results(jvm, tmp_path_factory):
    return run_world("prealloc_pass_world", tmp_path_factory.mktemp("ranks"), TEST_CLASSES)


def test_a_no_transfer_request_before_a_refused_reservation_is_preallocated_once(results):
    """Medium (pool half-changed, capacity leak). Promised (README, DecodePreallocQueue.pop_preallocated): a
    reservation kvshield cannot make aborts that one request while the rest of the queue is preallocated as usual.
    Before the fix ``disagg._salvage`` took out of the queue only the requests kvshield reserved for; a no-transfer
    request preallocated earlier in the same interrupted pass (its own pages, row, metadata index, ``send_metadata``
    done) stayed queued and SGLang's rerun preallocated it again: it held twice its pages until it finished and its
    first metadata index was never freed. SGLang's health check and warmup requests are such requests, so every
    refused reservation that followed one in a pass cost one metadata index for good."""
    passes(results, "nt_salvage")


def test_twin_salvaging_only_reserved_requests_preallocates_the_no_transfer_request_twice(results):
    fails(results, "nt_salvage/only_reserved", "preallocated twice")


def test_a_rebootstrapped_request_is_reserved_what_sglang_preallocates_for_it(results):
    """Medium (a supported path always failed: every PD true-retraction rebootstrap was aborted). Promised (README:
    PD rebootstrap runs as the request's tenant with ``KVSHIELD_RECOMPUTE_KEY``): a rebootstrapped decode request is
    preallocated and its prefill recompute lands in its reservation and commits. Before the fix SGLang preallocated
    ``len(origin_input_ids) + len(output_ids)`` slots for it (``DecodePreallocQueue._pre_alloc_fill_len``) while
    kvshield reserved ``len(req.origin_input_ids)`` (its admission limit check and the commit's coverage used the same
    short length), so ``_Reserved._take`` refused SGLang's larger ask and the request was aborted 503 ("decode prealloc
    asked for 11 slots; the reservation holds 10")."""
    passes(results, "rebootstrap")


def test_twin_reserving_the_input_only_refuses_the_rebootstrapped_request(results):
    fails(results, "rebootstrap/input_only", "the rebootstrapped request was refused")
