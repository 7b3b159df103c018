"""The hooks on SGLang's disaggregation queues.

In-process: the probe for SGLang's own handoff fix reads SGLang's code (this snapshot has none; the newer shape,
which rejects a request SGLang already refused before its bootstrap, is recognised) and COMPLIANCE refuses an
SGLang without it unless overridden; a hook target missing from SGLang fails closed, hooking nothing.

In a subprocess on the real SGLang (scenarios in ``disagg_world.py``): the issue's handoff scenarios through
SGLang's own prefill bootstrap, decode prealloc and transfer queues, over SGLang's fake transport and over a
transport that copies SGLang's metadata buffers (coverage carried in the metadata transfer), SGLang's
no-transfer (warmup) requests, a decode retraction and its resumption (SGLang's host copy), each oracle
reading decode bytes back, each with planted-bug twins that must fail it; and both shapes of SGLang's
rejection of refused requests (this snapshot's, and the newer one that rejects them before the handoff:
monkeypatched into the real module, labelled).
"""

import pytest

from conftest import TEST_CLASSES, require_module
from kvshield_sglang import plugin
from scenarios import fails, passes, run_world

torch = require_module("torch")


def newer_add_request_to_queue(original):
    """NEWER-SGLANG SHAPE (modelled on upstream's fix for rejected prefills entering disaggregation, 0.5.22+,
    not in this snapshot): the scheduler finishes a request it already refused (``to_finish`` set by its input
    validation) instead of handing it to the prefill bootstrap queue."""
    from sglang.srt.disaggregation.utils import DisaggregationMode, is_aborted, prepare_abort

    def _add_request_to_queue(self, req, is_retracted=False):
        if self.disaggregation_mode == DisaggregationMode.PREFILL and is_aborted(req):
            prepare_abort(req, req.to_finish.message, status_code=req.to_finish.status_code)
            self.output_streamer.stream_output([req], req.return_logprob)
            return
        return original(self, req, is_retracted)

    return _add_request_to_queue


def test_the_fix_probe_reads_sglangs_code_and_compliance_refuses_it_missing(monkeypatch, caplog):
    from sglang.srt.managers.scheduler import Scheduler

    from kvshield_sglang import disagg
    from kvshield_sglang.errors import UnsupportedFeatureError

    monkeypatch.delenv(disagg.ALLOW_UNFIXED, raising=False)
    assert not disagg.has_handoff_fix(), "this snapshot's create_sender has only the KV-capacity check"
    assert not disagg.check_handoff_fix("ZERO") and "handoff-isolation fix" in caplog.text
    with pytest.raises(UnsupportedFeatureError, match="COMPLIANCE refuses to start; set KVSHIELD_ALLOW_UNFIXED"):
        disagg.check_handoff_fix("COMPLIANCE")
    monkeypatch.setenv(disagg.ALLOW_UNFIXED, "1")
    assert disagg.check_handoff_fix("COMPLIANCE") is False  # overridden: starts, still flagged
    monkeypatch.setattr(Scheduler, "_add_request_to_queue", newer_add_request_to_queue(Scheduler._add_request_to_queue))
    assert disagg.has_handoff_fix() and disagg.check_handoff_fix("COMPLIANCE")


def test_a_missing_decode_target_fails_closed_hooking_nothing(monkeypatch):
    from sglang.srt.disaggregation import decode

    from kvshield_sglang import disagg, hooks

    monkeypatch.delattr(decode, "alloc_for_decode_prealloc")  # an SGLang whose _pre_alloc allocates inline
    add = decode.DecodePreallocQueue.add
    with pytest.raises(hooks.HookError, match="alloc_for_decode_prealloc does not exist"):
        disagg.install_decode()
    assert decode.DecodePreallocQueue.add is add, "admission hooked without the reservation"


# ---------------------------------------------------------------- through the hooked queues (subprocess)

@pytest.fixture(scope="module")
def scenarios(jvm, tmp_path_factory):
    return run_world("disagg_world", tmp_path_factory.mktemp("ranks"), TEST_CLASSES, KVSHIELD_HANDOFF_ACK_TIMEOUT_S="0")


def test_full_transfer_over_the_fake_transport_commits_exact_bytes_and_finishes(scenarios):
    passes(scenarios, "full")


def test_rejected_oversized_is_refused_and_decode_reads_nothing(scenarios):
    passes(scenarios, "oversized")


def test_twin_accepting_partial_coverage_serves_the_placeholder_over_stale_bytes(scenarios):
    fails(scenarios, "oversized/accepts_partial", "never sent")


@pytest.mark.parametrize("kind", ["coverage", "unwritten"])
def test_one_page_written_of_many_is_aborted(scenarios, kind):
    passes(scenarios, f"one_of_many/{kind}")


@pytest.mark.parametrize("kind", ["coverage", "unwritten"])
def test_twin_accepting_partial_coverage_decodes_unwritten_pages(scenarios, kind):
    fails(scenarios, f"one_of_many/{kind}/accepts_partial", "never sent")


def test_aborted_request_late_write_never_lands_in_another_request(scenarios):
    passes(scenarios, "late_write")


def test_twin_without_generation_check_corrupts_the_next_request(scenarios):
    fails(scenarios, "late_write/no_generation_check", "landed in B's pages")


def test_lost_acknowledgement_expires_keeps_pages_quarantined_and_backpressures(scenarios):
    passes(scenarios, "lost_ack")


def test_twin_freeing_on_timeout_lets_the_late_write_land(scenarios):
    fails(scenarios, "lost_ack/frees_on_timeout", "landed in B's pages")


def test_expiry_waits_for_the_acknowledgement_deadline(scenarios):
    passes(scenarios, "ack_deadline")


@pytest.mark.parametrize("name", ["drained_abort", "drained_abort/two_ranks"])
def test_an_aborted_transfer_every_prefill_rank_drained_gives_its_pages_back_scrubbed(scenarios, name):
    passes(scenarios, f"meta/{name}")


@pytest.mark.parametrize("name", ["drained_abort/no_ack", "drained_abort/one_of_two_acks"])
def test_an_aborted_transfer_released_before_every_drain_ack_expires_and_keeps_its_pages(scenarios, name):
    passes(scenarios, f"meta/{name}")


def test_twin_releasing_an_aborted_transfer_as_drained_without_acks_lets_its_late_chunk_land(scenarios):
    fails(scenarios, "meta/drained_abort/no_ack/released_as_drained", "landed in C's pages")


def test_limit_mismatch_refuses_the_request_naming_both_limits(scenarios):
    passes(scenarios, "limit_mismatch")


def test_twin_skipping_the_limit_check_accepts_the_peer(scenarios):
    fails(scenarios, "limit_mismatch/skips_check", "another limit was accepted")


def test_transport_without_coverage_fails_closed_naming_it(scenarios):
    passes(scenarios, "unsupported_transport")


# ---------------------------------------------------------------- Mooncake: coverage in the metadata transfer

@pytest.mark.parametrize("name", [
    "meta/full",  # full transfer: commits from the row and decodes its exact bytes
    "meta/incident",  # prefill sends one page of a placeholder, Success: refused, nothing read
    "meta/stale_row",  # a previous request's row at the reused metadata index is not accepted
    "meta/late_write",  # another room's late metadata write is refused (by SGLang's room check first)
    "meta/limit_mismatch",  # the row's prefill limit differs: refused naming both
    "meta/cross_tenant",  # another tenant's send lands in a request's room: the row's tenant differs, refused
    "meta/shared_room",  # a second live request on a room at one prefill server: refused before it sends
    "meta/decode_shared_room",  # a second live request on a room at one decode server: refused before reserving
])
def test_mooncake_coverage_from_the_metadata_transfer(scenarios, name):
    passes(scenarios, name)


@pytest.mark.parametrize("name, why", [
    ("meta/incident/accepts_partial", "never sent"),
    ("meta/stale_row/skips_clearing", "never sent"),
    ("meta/limit_mismatch/skips_check", "another limit was accepted"),
    ("meta/cross_tenant/skips_check", "decoded over t2's KV"),
    ("meta/shared_room/skips_check", "decodes over tenant t2's KV"),
])
def test_mooncake_twins_fail(scenarios, name, why):
    fails(scenarios, name, why)


@pytest.mark.parametrize("level", ["NONE", "ZERO"])
def test_a_draft_pool_the_prefill_never_carries_is_refused_under_none_and_served_zeroed_above(scenarios, level):
    passes(scenarios, f"meta/draft_not_carried/{level}")


def test_twin_not_comparing_the_carried_buffers_serves_another_requests_draft_kv(scenarios):
    fails(scenarios, "meta/draft_not_carried/NONE/skips_check", "never wrote")


# ---------------------------------------------------------------- SGLang's no-transfer requests

def test_no_transfer_request_decodes_over_zeroed_pages_and_is_refused_under_none(scenarios):
    passes(scenarios, "no_transfer")


def test_twin_admitting_a_no_transfer_request_under_none_reads_stale_bytes(scenarios):
    fails(scenarios, "no_transfer/admits_under_none", "read another request's bytes")


# ---------------------------------------------------------------- feature probes (in process)

def test_metadata_row_is_listed_last_and_written_before_the_last_send(scenarios):
    passes(scenarios, "metadata_row")


def test_sender_without_send_cannot_publish_and_says_so(caplog):
    from types import SimpleNamespace

    from kvshield_sglang import transport

    class Sender:
        def init(self, num_pages, aux_index=None):
            pass

    buffers = SimpleNamespace(kvshield_coverage=torch.zeros((2, transport.ROW_WORDS), dtype=torch.int64))
    req = SimpleNamespace(rid="r", origin_input_ids=[1], bootstrap_room=1)
    assert transport.arm_sender(Sender(), req, buffers, 4, 32, tenant="acme", carried=4) is False
    assert "cannot publish coverage" in caplog.text and "Sender" in caplog.text


def test_decode_queue_without_a_row_buffer_refuses_naming_it():
    from types import SimpleNamespace

    from kvshield_sglang import transport
    from kvshield_sglang.errors import HandoffError

    receiver = SimpleNamespace(send_metadata=lambda *a, **k: None)
    req = SimpleNamespace(rid="r", bootstrap_room=1, bootstrap_host="h", bootstrap_port=1)
    with pytest.raises(HandoffError, match="holds no kvshield row") as e:
        transport.METADATA.bind(receiver, req, SimpleNamespace())
    assert e.value.status_code == 500



def test_reservation_refused_after_sglangs_budget_fails_only_that_request(scenarios):
    passes(scenarios, "reserve_refused")


def test_twin_taking_pages_before_the_claim_check_leaks_them(scenarios):
    fails(scenarios, "reserve_refused/allocates_before_refusing", "pages leaked")


def test_fake_transport_board_is_empty_after_transfers_aborts_and_expiries(scenarios):
    passes(scenarios, "board_pruned")


def test_twin_board_that_never_forgets_keeps_rooms(scenarios):
    fails(scenarios, "board_pruned/never_forgets", "the board still holds rooms")


def test_retracted_and_resumed_request_gets_no_second_reservation_and_frees_its_own_pages_once(scenarios):
    passes(scenarios, "retracted_resumed")


def test_twin_allocating_the_resumed_request_unplanned_gives_it_pages_not_its_own(scenarios):
    fails(scenarios, "retracted_resumed/plans_nothing", "pages are not its own")


def test_twin_reserving_again_on_resume_gives_a_second_reservation(scenarios):
    fails(scenarios, "retracted_resumed/reserves_again", "second handoff reservation")


def test_the_bootstrap_queue_never_creates_a_sender_for_a_refused_or_oversized_request(scenarios):
    passes(scenarios, "prefill_refuses")


def test_a_prompt_at_the_limit_commits_its_bytes_and_one_token_more_gets_no_sender(scenarios):
    passes(scenarios, "at_the_limit")


def test_newer_sglang_rejecting_before_the_handoff_is_handled_too(scenarios):
    passes(scenarios, "newer_shape")


# ---------------------------------------------------------------- bootstrap rooms and quotas (found by attack)

def test_control_the_decode_room_scenario_passes_without_an_intruder(scenarios):
    passes(scenarios, "decode_dup/control")


@pytest.mark.parametrize("kind", ["room", "oversized"])
def test_decode_refusing_a_second_request_on_a_room_leaves_the_first_request_decoding(scenarios, kind):
    """disagg.py: a request whose bootstrap room another live request holds is refused (400) "before anything is
    reserved, so a transfer for that room can only land in the first one's pages"; the refusal of the intruder must
    not disturb the live request. Found by attack: the refused request's ``_forget`` dropped the room's transport
    state (the fake transport's loopback board entry of the live request), so the live request's commit found no
    coverage and was aborted (500): any client naming a live room aborted it."""
    passes(scenarios, f"decode_dup/{kind}")


def test_control_fake_host_scenario_passes_without_an_intruder(scenarios):
    passes(scenarios, "fake_host/control")


def test_a_fake_bootstrap_host_request_on_a_live_room_leaves_that_request_decoding(scenarios):
    """disagg.py: "two live requests never share a room on one server"; SGLang's no-transfer requests (fake bootstrap
    host, which any client may name) are exempt from the prefill room check (``_to_fake_host``), yet SGLang gives them
    a FakeKVSender on the client's room. Found by attack: its hooked __init__ re-opened the room on the loopback board,
    replacing the live request's count and tenant tag, and the live request was aborted; a live room's count is now
    its first sender's."""
    passes(scenarios, "fake_host/intruder")


def test_control_decode_quota_that_holds_the_worst_case(scenarios):
    passes(scenarios, "decode_quota/4")


def test_a_decode_server_admits_a_handoff_only_if_its_tenants_quota_holds_its_worst_case(scenarios):
    """README (tenant quotas): a quota is "a per-request outcome, never a failed batch allocation (SGLang's
    allocation.py raises on None)" and an admitted request's worst case (input plus max_new_tokens) is reserved; a
    tenant at its quota cannot take pages through any path. On a decode server SGLang's PrefillAdder (where the
    quota hook sits) never runs and the handoff reserves only the input's pages. Found by attack: a request whose
    worst case exceeded its tenant's quota was admitted and committed, and its first decode token past the quota
    got None from alloc_decode, so SGLang's alloc_for_decode raised "Decode out of memory" for the whole running
    batch; decode admission now checks the worst case against the quota."""
    passes(scenarios, "decode_quota/3")


def test_compliance_with_surrounding_whitespace_still_refuses_without_the_handoff_fix(jvm, monkeypatch):
    """disagg.check_handoff_fix: without SGLang's handoff-isolation fix, "under COMPLIANCE refuses (the hook is
    then recorded as failed and the rank does not serve) unless KVSHIELD_ALLOW_UNFIXED_HANDOFF=1". The level
    comes from KVSHIELD_LEVEL, which the Java settings read trimmed and case-folded: "COMPLIANCE " (a trailing
    space, as an env file leaves it) runs the pool at COMPLIANCE (it demands the signed audit trail's key). The
    plug-in's handoff-fix hook must then refuse as it does for "COMPLIANCE", naming the override."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang import disagg
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import KvShieldError, UnsupportedFeatureError

    monkeypatch.delenv(disagg.ALLOW_UNFIXED, raising=False)
    monkeypatch.setenv("KVSHIELD_LEVEL", "COMPLIANCE ")
    assert not disagg.has_handoff_fix(), "this snapshot's create_sender has only the KV-capacity check"
    # The pool reads the same setting as COMPLIANCE: it refuses to open without the audit signing key.
    with pytest.raises(KvShieldError, match="COMPLIANCE writes a signed audit trail"):
        PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", MHAPool(32, 4), False,
                                    kvshield_settings={"advertisedContextTokens": 32})
    # The plug-in's hook (installed as plugin.HOOKS' "handoff-fix") must refuse the same level.
    with pytest.raises(UnsupportedFeatureError, match="COMPLIANCE refuses to start"):
        plugin._install_disagg("check_handoff_fix")(None)
