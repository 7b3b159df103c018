"""Hooks into SGLang's disaggregation queues (``sglang.srt.disaggregation``), probed by feature.

- Prefill (``PrefillBootstrapQueue.add``): a request already finished (rejected for length, shrunk to a
  placeholder) or longer than the pool's effective limit never enters the bootstrap queue; it is
  aborted with 400 and its error streamed to the client.
- Decode (``DecodeTransferQueue.pop_transferred``): a request the transport reports transferred is
  committed through its kvshield reservation against the coverage the sender published; a refusal
  aborts it (500, abort finish reason) instead of letting it decode over unwritten pages.

SGLang versions without the upstream handoff-isolation fix (the rejected-request check before
bootstrap) get a loud warning; under ``COMPLIANCE`` kvshield refuses to start on them unless
``KVSHIELD_ALLOW_UNFIXED_HANDOFF=1``.
"""

import inspect
import logging
import os
from http import HTTPStatus

from .errors import HandoffError, UnsupportedFeatureError

logger = logging.getLogger(__name__)
ALLOW_UNFIXED = "KVSHIELD_ALLOW_UNFIXED_HANDOFF"
# NOTE: markers of the upstream fix for the incident path: the bootstrap queue checks a request's
# finished state (or its KV capacity) before bootstrapping it.
_FIX_MARKERS = (".finished()", "finished_reason", "_check_if_req_exceed_kv_capacity")


def probe(prefill_queue_cls=None, transfer_queue_cls=None):
    """What this SGLang offers: ``{"prefill_add", "decode_pop_transferred", "rejected_check"}`` → bool."""
    add = getattr(prefill_queue_cls, "add", None)
    add = getattr(add, "_kvshield_original", add)  # NOTE: probe SGLang's code, not our wrapper
    pop = getattr(transfer_queue_cls, "pop_transferred", None)
    try:
        src = inspect.getsource(add) if add else ""
    except (OSError, TypeError):
        src = ""
    return {"prefill_add": callable(add), "decode_pop_transferred": callable(pop),
            "rejected_check": any(m in src for m in _FIX_MARKERS)}


def check_fixes(features, level):
    """Warns loudly without the upstream fix; under COMPLIANCE refuses unless overridden."""
    if features["rejected_check"]:
        return True
    msg = ("SGLang's PrefillBootstrapQueue.add has no rejected-request check (upstream handoff-isolation fix "
           "missing): a request rejected for length could enter the prefill→decode handoff. kvshield's hook "
           "blocks it, but upgrade SGLang.")
    logger.warning("kvshield: %s", msg)
    if str(level).upper() == "COMPLIANCE" and os.environ.get(ALLOW_UNFIXED) != "1":
        raise UnsupportedFeatureError(f"{msg} COMPLIANCE refuses to start; set {ALLOW_UNFIXED}=1 to override")
    return False


def fail_request(req, error, prepare_abort=None):
    """Marks ``req`` to finish with an abort carrying ``error``'s status: SGLang's ``prepare_abort``
    when present, else its finish-reason shape."""
    if prepare_abort is None:
        try:
            from sglang.srt.disaggregation.utils import prepare_abort
        except ImportError:
            prepare_abort = None
    if prepare_abort is not None:
        prepare_abort(req, str(error), status_code=error.status_code)
    else:
        req.finished_reason = dict(error.finish_reason)


def _allocator_of(queue):
    sched = getattr(queue, "scheduler", None)
    return getattr(queue, "token_to_kv_pool_allocator", None) or getattr(sched, "token_to_kv_pool_allocator", None)


def _stream(queue, reqs):
    sched = getattr(queue, "scheduler", None)
    if sched is not None and hasattr(sched, "stream_output"):
        sched.stream_output(reqs, any(getattr(r, "return_logprob", False) for r in reqs))


def install(prefill_queue_cls=None, transfer_queue_cls=None, level=None, prepare_abort=None):
    """Wraps the queues that are present; returns the probed features. Idempotent per class."""
    features = probe(prefill_queue_cls, transfer_queue_cls)
    check_fixes(features, level or os.environ.get("KVSHIELD_LEVEL", "ZERO"))
    if features["prefill_add"] and not getattr(prefill_queue_cls.add, "_kvshield", False):
        prefill_queue_cls.add = _wrap_add(prefill_queue_cls.add, prepare_abort)
    if features["decode_pop_transferred"] and not getattr(transfer_queue_cls.pop_transferred, "_kvshield", False):
        transfer_queue_cls.pop_transferred = _wrap_pop(transfer_queue_cls.pop_transferred, prepare_abort)
    return features


def _wrap_add(original, prepare_abort):
    def add(self, req, *args, **kwargs):
        alloc = _allocator_of(self)
        error = None
        if req.finished() if callable(getattr(req, "finished", None)) else getattr(req, "finished_reason", None):
            error = HandoffError(f"request {req.rid} was rejected before bootstrap; it never starts a handoff",
                                 int(HTTPStatus.BAD_REQUEST))
        elif alloc is not None and hasattr(alloc, "admission_limits"):
            effective, _ = alloc.admission_limits()
            n = len(req.origin_input_ids)
            if n > effective:
                error = HandoffError(f"request {req.rid} of {n} tokens exceeds the effective limit of {effective} tokens",
                                     int(HTTPStatus.BAD_REQUEST))
        if error is not None:
            fail_request(req, error, prepare_abort)
            _stream(self, [req])
            return None
        return original(self, req, *args, **kwargs)

    add._kvshield = True
    add._kvshield_original = original
    return add


def _wrap_pop(original, prepare_abort):
    def pop_transferred(self, *args, **kwargs):
        done = original(self, *args, **kwargs)
        handoff = getattr(_allocator_of(self), "kvshield_handoff", None)
        if handoff is None:
            return done
        ok, failed = [], []
        for req in done:
            try:
                handoff.commit(req.rid, getattr(req, "kvshield_covered_tokens", 0))
                ok.append(req)
            except HandoffError as e:
                logger.error("kvshield: %s", e)
                fail_request(req, e, prepare_abort)
                failed.append(req)
        if failed:
            _stream(self, failed)
        return ok

    pop_transferred._kvshield = True
    return pop_transferred


def install_in_sglang(level=None):
    """Installs the hooks on the SGLang in this process, if it has disaggregation; returns the features or None."""
    try:
        from sglang.srt.disaggregation.decode import DecodeTransferQueue
        from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
    except ImportError:
        return None
    return install(PrefillBootstrapQueue, DecodeTransferQueue, level)
