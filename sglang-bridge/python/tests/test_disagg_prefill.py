"""The prefill side of SGLang's disaggregation under kvshield: a request's source pages stay claimed until
the transfer that reads them has concluded.

In a subprocess on the real SGLang (scenarios in ``prefill_world.py``), through SGLang's own ``send_kv_chunk``,
``process_prefill_chunk`` and inflight queue with kvshield's hooks: each oracle reads back the bytes the transport
reads (or the pool's free space), and each has a planted-bug twin that must fail it. A missing hook target is
covered in ``test_engine_hooks``/``test_ranks`` (recorded, the rank refuses to serve).
"""

import gc
import types

import pytest

from conftest import TEST_CLASSES
from scenarios import fails, passes, run_world


@pytest.fixture(scope="module")
def scenarios(jvm, tmp_path_factory):
    return run_world("prefill_world", tmp_path_factory.mktemp("ranks"), TEST_CLASSES)


def test_aborted_request_transfer_reads_its_own_bytes_until_it_concludes_then_pages_are_scrubbed_and_reused(scenarios):
    passes(scenarios, "aborted")


def test_twin_releasing_without_claims_lets_the_transfer_read_the_next_request(scenarios):
    fails(scenarios, "aborted/releases_without_claims", "read other bytes")


def test_unconcluded_transfer_expires_with_alarm_and_its_pages_stay_out_of_circulation(scenarios):
    passes(scenarios, "never_concludes")


def test_twin_freeing_on_timeout_returns_pages_the_transport_may_still_read(scenarios):
    fails(scenarios, "never_concludes/frees_on_timeout", "expired pages returned to circulation")


def test_completed_chunked_transfer_drops_claims_and_frees_scrubbed_pages_without_host_syncs(scenarios):
    passes(scenarios, "completes")


def test_twin_keeping_claims_never_frees_the_pages(scenarios):
    fails(scenarios, "completes/keeps_claims", "were not freed")


def test_transfer_concluding_before_sglangs_release_drops_claims_then_the_release_frees(scenarios):
    passes(scenarios, "completes_before_release")


def test_twin_keeping_claims_holds_the_pages_after_sglangs_release(scenarios):
    fails(scenarios, "completes_before_release/keeps_claims", "were not freed")


def test_refused_chunks_never_reach_the_transport_and_the_error_reaches_the_client(scenarios):
    passes(scenarios, "refused_claim")


def test_twin_sending_unclaimed_chunks_hands_the_transport_a_page_the_request_lost(scenarios):
    fails(scenarios, "refused_claim/sends_unclaimed", "a refused chunk reached the transport")


def test_a_staged_chunk_refused_after_handing_over_a_segment_keeps_that_segment_claimed(scenarios):
    passes(scenarios, "staged_refusal")


def test_twin_judging_handed_over_by_marked_coverage_lets_the_next_tenant_take_the_page(scenarios):
    fails(scenarios, "staged_refusal/judges_by_coverage", "from A's page handed over")


def test_prefix_cache_hit_is_sent_with_its_cached_pages_claimed_then_evictable_and_freed(scenarios):
    passes(scenarios, "prefix_cache_hit_completes")


def test_twin_keeping_claims_holds_the_evicted_cache_pages(scenarios):
    fails(scenarios, "prefix_cache_hit_completes/keeps_claims", "were not freed")


def test_prefix_cache_eviction_mid_transfer_leaves_the_transport_reading_the_requests_bytes(scenarios):
    passes(scenarios, "prefix_cache_evicted_mid_transfer")


def test_twin_claiming_only_own_pages_lets_evicted_cache_pages_be_reused_under_the_transfer(scenarios):
    fails(scenarios, "prefix_cache_evicted_mid_transfer/claims_own_pages_only", "read other bytes")


def test_stock_cache_hit_on_an_earlier_requests_pages_is_sent_with_them_claimed(scenarios):
    passes(scenarios, "stock_prefix_hit")


def test_twin_claiming_only_own_pages_lets_the_earlier_requests_pages_be_reused_under_the_transfer(scenarios):
    fails(scenarios, "stock_prefix_hit/claims_own_pages_only", "read other bytes")


def test_page_of_another_tenant_refuses_the_chunk_with_nothing_handed_over(scenarios):
    passes(scenarios, "foreign_page")


def test_twin_skipping_the_tenant_check_sends_another_tenants_page(scenarios):
    fails(scenarios, "foreign_page/skips_tenant_check", "a page of another tenant reached the transport")


def test_control_a_prefill_room_is_free_once_its_request_succeeded(scenarios):
    passes(scenarios, "room_free/success")


@pytest.mark.parametrize("path", ["foreign_page", "expired"])
def test_a_prefill_room_is_free_once_its_request_concluded_whatever_the_path(scenarios, path):
    """disagg.py LiveRooms / README: the prefill server frees a request's bootstrap room when its sender concludes,
    whatever the path (SGLang's ``done`` list, a chunk kvshield refused, an expired send drained later by ``sweep``),
    decided from the requests' state and never from garbage collection: the Req sits in a reference cycle
    (``_claim_before_send`` closes over it on its own sender), and each tensor-parallel rank's collector runs at its
    own time, so a collector-dependent decision would differ between ranks. Found by attack: the room stayed taken
    until the collector ran."""
    passes(scenarios, f"room_free/{path}")


def test_a_finished_senders_count_does_not_take_a_reused_rooms_board_entry():
    """Rooms are "held by request state, never by garbage collection" (design note 14, disagg.LiveRooms), and
    LoopbackBoard.open publishes a sender's count "unless another *live* sender's count is". But the board holds
    counts weakly, and arm_sender makes every armed fake sender a reference cycle (sender.init -> armed_init ->
    the bound original init -> sender), so a finished request's sender, dropped by SGLang, stays on the board until
    the cyclic collector happens to run. A later request legitimately reusing the room (PREFILL_ROOMS lets it: the
    first one finished) then gets an unpublished count: its decode side reads the finished request's token count
    and the finished request's *tenant* for the room."""
    import torch

    from sglang.srt.disaggregation.fake import conn
    from kvshield_sglang import transport

    transport.install_fake(conn)
    mgr = types.SimpleNamespace(kv_args=types.SimpleNamespace(page_size=4))
    rows = types.SimpleNamespace(kvshield_coverage=torch.zeros((4, transport.ROW_WORDS), dtype=torch.int64))
    room = 918273

    def a_request(rid, tenant, n_pages):
        req = types.SimpleNamespace(rid=rid, origin_input_ids=list(range(4 * n_pages)), bootstrap_room=room)
        sender = conn.FakeKVSender(mgr, "127.0.0.1:1", room, [0], 0)
        req.disagg_kv_sender = sender
        assert transport.arm_sender(sender, req, rows, 4, 1024, tenant=tenant, carried=4)
        sender.init(n_pages, 0)
        sender.send(list(range(n_pages)))
        return req

    was = gc.isenabled()
    gc.collect()
    gc.disable()  # the collector has not run between the two requests (it runs by allocation thresholds)
    try:
        a = a_request("A", "tenant-a", 1)
        del a  # request A finished; SGLang drops it and its sender
        b = a_request("B", "tenant-b", 3)
        assert transport.LOOPBACK.tenant(room) == transport.tenant_tag("tenant-b"), (
            f"room {room}'s board entry is the finished request A's (tenant tag {transport.LOOPBACK.tenant(room)},"
            f" {transport.LOOPBACK.sent(room)} tokens), not live request B's ({b.disagg_kv_sender._kvshield_sent.tokens}"
            " tokens)")
        assert transport.LOOPBACK.sent(room) == 12
    finally:
        if was:
            gc.enable()
        transport.LOOPBACK.forget(room)
