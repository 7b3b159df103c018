"""The hooks on SGLang's disaggregation queues, driven with SGLang-shaped fakes: a rejected request
never enters the bootstrap queue and its client sees an abort (400); a transfer whose commit is
refused is aborted (500) instead of decoding; an SGLang without the upstream fix is flagged, and
COMPLIANCE refuses it unless overridden. Plus the radix-cache backend registration."""

from http import HTTPStatus

import pytest

from conftest import require_module
from test_handoff import PEER, Pair

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


def test_refused_commit_aborts_instead_of_decoding(jvm):
    from kvshield_sglang import disagg
    from kvshield_sglang.handoff import Handoff

    P, D = _classes(with_fix=True)
    disagg.install(P, D, level="ZERO", prepare_abort=_prepare_abort)
    p = Pair()
    p.da.kvshield_handoff = p.decode
    good, partial = Req("g", 8), Req("h", 8)
    for r in (good, partial):
        p.prefill_request(r.rid, "t1", 8, 1.0)
        p.decode.reserve(r.rid, "t1", 8, PEER)
    p.prefill.copy_to(p.decode, "g")
    p.prefill.mark_sent("g", 8)
    good.kvshield_covered_tokens = p.prefill.sent_tokens("g")
    p.prefill.copy_to(p.decode, "h", 0, 1)
    p.prefill.mark_sent("h", 4)
    partial.kvshield_covered_tokens = p.prefill.sent_tokens("h")
    q = D(Scheduler(p.da), [good, partial])
    assert q.pop_transferred() == [good]
    assert partial.finished_reason["type"] == "abort" and partial.finished_reason["status_code"] == 500
    assert "covered 4 of 8" in partial.finished_reason["message"]
    assert q.scheduler.streamed == [partial]
    assert isinstance(p.decode, Handoff) and p.decode.outcome("g") == "COMMITTED"


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
