"""The hooks on SGLang's disaggregation queues.

In-process, with SGLang-shaped fakes: a rejected request never enters the bootstrap queue and its
client sees an abort (400); an SGLang without the upstream fix is flagged, and COMPLIANCE refuses it
unless overridden. Plus the radix-cache backend registration.

In a subprocess against the SGLang stand-in (tests/stub_sglang; scenarios in ``disagg_world.py``):
the issue's handoff scenarios through the hooked prefill bootstrap, decode prealloc and transfer
queues, over SGLang's fake transport and over Mooncake (coverage carried in SGLang's metadata
transfer), SGLang's no-transfer (warmup) requests, each oracle reading decode bytes back, each with
planted-bug twins that must fail it.
"""

from http import HTTPStatus

import pytest

from conftest import TEST_CLASSES, require_module
from scenarios import fails, passes, run_world
from test_handoff import Pair

torch = require_module("torch")


class Req:
    def __init__(self, rid, n, finished=None):
        self.rid, self.origin_input_ids, self.finished_reason, self.return_logprob = rid, list(range(n)), finished, False

    def finished(self):
        return self.finished_reason is not None


def _prepare_abort(req, message, status_code):  # SGLang's shape: FINISH_ABORT(message, status_code)
    req.finished_reason = {"type": "abort", "message": message, "status_code": int(status_code)}


class Scheduler:
    def __init__(self, allocator):
        self.token_to_kv_pool_allocator, self.streamed = allocator, []

    def stream_output(self, reqs, return_logprob):
        self.streamed.extend(reqs)


def _classes(with_fix):
    class PrefillBootstrapQueue:
        def __init__(self, scheduler):
            self.scheduler, self.queue = scheduler, []

        if with_fix:
            def add(self, req, num_kv_heads=1):
                if req.finished():
                    return
                self.queue.append(req)
        else:
            def add(self, req, num_kv_heads=1):
                self.queue.append(req)

    class DecodeTransferQueue:
        def __init__(self, scheduler, done):
            self.scheduler, self.done = scheduler, done

        def pop_transferred(self):
            out, self.done = self.done, []
            return out

    return PrefillBootstrapQueue, DecodeTransferQueue


def test_rejected_or_oversized_requests_never_bootstrap(jvm):
    from kvshield_sglang import disagg

    P, D = _classes(with_fix=True)
    assert disagg.install(P, D, level="ZERO", prepare_abort=_prepare_abort)["rejected_check"]
    p = Pair()
    q = P(Scheduler(p.pa))
    limit = p.pa.admission_limits()[0]
    rejected = Req("r1", 1, finished={"type": "length"})  # shrunk placeholder of a rejected prompt
    oversized = Req("r2", limit + 1)
    fine = Req("r3", 8)
    for r in (rejected, oversized, fine):
        q.add(r)
    assert q.queue == [fine]
    for r in (rejected, oversized):
        assert r.finished_reason["type"] == "abort" and r.finished_reason["status_code"] == HTTPStatus.BAD_REQUEST
    assert q.scheduler.streamed == [rejected, oversized]


def test_sglang_without_the_fix_warns_and_compliance_refuses(jvm, monkeypatch, caplog):
    from kvshield_sglang import disagg
    from kvshield_sglang.errors import UnsupportedFeatureError

    P, D = _classes(with_fix=False)
    monkeypatch.delenv(disagg.ALLOW_UNFIXED, raising=False)
    assert not disagg.install(P, D, level="ZERO")["rejected_check"]
    assert "handoff-isolation fix" in caplog.text
    with pytest.raises(UnsupportedFeatureError, match="COMPLIANCE refuses"):
        disagg.install(P, D, level="COMPLIANCE")
    monkeypatch.setenv(disagg.ALLOW_UNFIXED, "1")
    assert disagg.install(P, D, level="COMPLIANCE")["prefill_add"]


def test_decode_prealloc_without_the_hook_point_warns(caplog):
    from types import SimpleNamespace

    from kvshield_sglang import disagg

    class DecodePreallocQueue:  # an SGLang whose _pre_alloc allocates inline (no alloc_for_decode_prealloc)
        def add(self, req):
            pass

        def pop_preallocated(self):
            return [], []

    features = disagg.install(level="ZERO", decode_module=SimpleNamespace(DecodePreallocQueue=DecodePreallocQueue))
    assert features["decode_prealloc"] is False
    assert "every transferred request is refused at commit" in caplog.text
    assert not getattr(DecodePreallocQueue.add, "_kvshield", False), "admission hooked without the reservation"


def test_prefix_backend_registers_once():
    from kvshield_sglang import prefix_cache

    class Registry:
        def __init__(self):
            self.backends = {}

        def register_radix_cache_backend(self, name, factory):
            if name in self.backends:
                raise ValueError(f"{name!r} is already registered")
            self.backends[name] = factory

        def registered_radix_cache_backends(self):
            return list(self.backends)

    reg = Registry()
    assert prefix_cache.register(reg) and prefix_cache.register(reg)
    assert list(reg.backends) == ["kvshield"]
    assert not prefix_cache.register(object())


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
    "meta/late_write",  # another room's late metadata write is refused
    "meta/limit_mismatch",  # the row's prefill limit differs: refused naming both
])
def test_mooncake_coverage_from_the_metadata_transfer(scenarios, name):
    passes(scenarios, name)


@pytest.mark.parametrize("name, why", [
    ("meta/incident/accepts_partial", "never sent"),
    ("meta/stale_row/skips_clearing", "never sent"),
    ("meta/late_write/ignores_room", "never sent"),
    ("meta/limit_mismatch/skips_check", "another limit was accepted"),
])
def test_mooncake_twins_fail(scenarios, name, why):
    fails(scenarios, name, why)


# ---------------------------------------------------------------- SGLang's no-transfer requests

def test_no_transfer_request_decodes_over_zeroed_pages_and_is_refused_under_none(scenarios):
    passes(scenarios, "no_transfer")


def test_twin_admitting_a_no_transfer_request_under_none_reads_stale_bytes(scenarios):
    fails(scenarios, "no_transfer/admits_under_none", "read another request's bytes")


# ---------------------------------------------------------------- feature probes (in process)

def test_metadata_buffers_without_get_buf_infos_are_not_extended(caplog):
    from types import SimpleNamespace

    from kvshield_sglang import transport

    class MetadataBuffers:  # an SGLang whose buffers the transports do not list
        def __init__(self, size):
            self.size = size

    assert transport.install_metadata(SimpleNamespace(MetadataBuffers=MetadataBuffers)) is False
    assert not hasattr(MetadataBuffers(4), "kvshield_coverage") and "no get_buf_infos" in caplog.text


def test_metadata_row_is_listed_last_and_written_before_the_last_send():
    from types import SimpleNamespace

    from kvshield_sglang import transport

    class MetadataBuffers:
        def __init__(self, size):
            self.output_ids = torch.zeros((size, 16), dtype=torch.int32)

        def get_buf_infos(self):
            b = self.output_ids
            return [b.data_ptr()], [b.numel() * 4], [64]

    class Sender:
        def __init__(self, rows):
            self.rows, self.seen = rows, []

        def init(self, num_pages, aux_index=None):
            pass

        def send(self, kv_indices, state_indices=None):  # what the transport would copy now
            self.seen.append(self.rows[2, :4].tolist())

    assert transport.install_metadata(SimpleNamespace(MetadataBuffers=MetadataBuffers))
    buffers = MetadataBuffers(4)
    ptrs, lens, items = buffers.get_buf_infos()
    assert ptrs[-1] == buffers.kvshield_coverage.data_ptr() and items[-1] == 64 and lens[-1] == 4 * 64
    req = SimpleNamespace(rid="r", origin_input_ids=list(range(10)), bootstrap_room=99)
    sender = Sender(buffers.kvshield_coverage)
    assert transport.arm_sender(sender, req, buffers, page_size=4, limit_tokens=32)
    sender.init(3, 2)
    sender.send([5, 6])
    sender.send([7])
    assert sender.seen == [[0, 0, 0, 0], [transport.ROW_MAGIC, 99, 10, 32]], sender.seen


def test_sender_without_send_cannot_publish_and_says_so(caplog):
    from types import SimpleNamespace

    from kvshield_sglang import transport

    class Sender:
        def init(self, num_pages, aux_index=None):
            pass

    buffers = SimpleNamespace(kvshield_coverage=torch.zeros((2, transport.ROW_WORDS), dtype=torch.int64))
    req = SimpleNamespace(rid="r", origin_input_ids=[1], bootstrap_room=1)
    assert transport.arm_sender(Sender(), req, buffers, 4, 32) is False
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
