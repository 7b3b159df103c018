"""Attack round 21 (the prefill/decode handoff): each finding is a scenario in ``round21_world.py`` run in a
subprocess on the real SGLang; each test fails on the code it was found on. Docstrings: promised vs what happens."""

import pytest

from conftest import TEST_CLASSES
from scenarios import passes, run_world


@pytest.fixture(scope="module")
def results(jvm, tmp_path_factory):
    return run_world("round21_world", tmp_path_factory.mktemp("ranks"), TEST_CLASSES, KVSHIELD_HANDOFF_ACK_TIMEOUT_S="0")


def test_an_aborted_metadata_transfer_that_drained_gives_its_pages_and_index_back(results):
    """Medium (capacity leak, client-triggerable). Promised (README: pages quarantined "until it drains"; promise 3:
    no page lost): once an aborted transfer's transport has concluded, its pages and metadata index come back. What
    happens: ``MetadataTransport.acknowledged`` (transport.py) is true only after ``accept``, which only a commit
    calls; an aborted request never commits, so even after its last chunk and its own row landed (Success) it is
    expired and its pages and metadata index are held for the life of the process: each client disconnect mid-transfer
    removes them for good."""
    passes(results, "meta_drain")


def test_a_metadata_transfer_that_lost_a_chunk_never_commits_the_unwritten_pages(results):
    """High (the request is served, 200, over KV its transfer never wrote: zeros at ZERO, so its own KV corrupted;
    the previous holder's bytes wherever a page is not scrubbed, as the planted stale KV here shows). Promised (PD
    promise 1): a page reserved but never written is never readable as the request's, whatever the transport reports.
    What happens: over the metadata transports the commit takes the row's covered tokens as the evidence and records
    every covered slot as written (disagg.py ``_coverage``: ``handoff.record_covered(req, min(covered, ...))``), and
    the row counts pages prefill handed its sender (transport.py ``arm_sender``: ``plan["sent"] += len(kv_indices)``),
    not pages the transport wrote. A transport that loses a chunk but completes (the silent Success SGLang's update
    describes) commits pages nobody wrote."""
    passes(results, "meta_drop")
