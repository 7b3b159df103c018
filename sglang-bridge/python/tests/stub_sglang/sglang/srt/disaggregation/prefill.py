class PrefillBootstrapQueue:
    """Stock behaviour before the upstream handoff-isolation fix: every request is bootstrapped."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue = []

    def add(self, req, num_kv_heads):
        self.queue.append(req)


# ---------------------------------------------------------------- the scheduler's prefill mixin
# Mirrors ``SchedulerDisaggregationPrefillMixin`` of sglang/srt/disaggregation/prefill.py: the KV of a
# request is handed to its sender chunk by chunk (``send_kv_chunk``: page ids of the request's
# req_to_token row, the trailing partial page held back until the last chunk), finished requests go
# to the inflight queue, and ``process_disagg_prefill_inflight_queue`` polls each sender: on Success or
# Failed SGLang releases the request's KV (``release_kv_cache``) and streams its output. Logprobs,
# metrics, metadata buffers' contents, PP consensus and state (Mamba/SWA/NSA) payloads are left out.

from http import HTTPStatus  # noqa: E402

from sglang.srt.disaggregation.base import KVPoll  # noqa: E402
from sglang.srt.disaggregation.utils import FINISH_ABORT, kv_to_page_indices, prepare_abort  # noqa: E402
from sglang.srt.mem_cache.common import release_kv_cache  # noqa: E402


class FINISH_LENGTH:
    """SGLang's ``schedule_batch.FINISH_LENGTH``: prefill's requests finish with length 0 once sent."""

    def __init__(self, length):
        self.length = length


def release_req_to_metadata_buffer(req, allocator):
    if getattr(req, "metadata_buffer_index", None) is not None and req.metadata_buffer_index >= 0:
        allocator.free(req.metadata_buffer_index)
        req.metadata_buffer_index = -1


class SchedulerDisaggregationPrefillMixin:
    """Needs from the scheduler: ``token_to_kv_pool_allocator``, ``req_to_token_pool``, ``tree_cache``,
    ``disagg_prefill_inflight_queue``, ``req_to_metadata_buffer_idx_allocator``, ``stream_output``."""

    def process_batch_result_disagg_prefill(self, batch, result):
        for req, next_token_id in zip(batch.reqs, result.next_token_ids, strict=True):
            if req.is_chunked <= 0:
                req.output_ids.append(next_token_id)
                self.disagg_prefill_inflight_queue.append(req)
                self.send_kv_chunk(req, last_chunk=True)
                if req.grammar is not None:
                    try:
                        req.grammar.accept_token(next_token_id)
                    except ValueError as e:  # SGLang releases the KV now; the transfer may still read it
                        release_kv_cache(req, self.tree_cache)
                        prepare_abort(req, f"Grammar accept_token failed for req {req.rid}: {e}",
                                      status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
            else:
                req.is_chunked -= 1

    def process_disagg_prefill_inflight_queue(self, rids_to_check=None):
        if len(self.disagg_prefill_inflight_queue) == 0:
            return []
        done_reqs, undone_reqs = [], []
        polls = [req.disagg_kv_sender.poll() for req in self.disagg_prefill_inflight_queue]
        for req, poll in zip(self.disagg_prefill_inflight_queue, polls):
            if rids_to_check is not None and req.rid not in rids_to_check:
                undone_reqs.append(req)
            elif poll in (KVPoll.WaitingForInput, KVPoll.Transferring):
                undone_reqs.append(req)
            elif poll == KVPoll.Success:
                release_kv_cache(req, self.tree_cache)
                req.finished_reason = FINISH_LENGTH(length=0)
                done_reqs.append(req)
            elif poll == KVPoll.Failed:
                release_kv_cache(req, self.tree_cache)
                prepare_abort(req, f"Prefill transfer failed for request {req.rid=}",
                              status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
                done_reqs.append(req)
            else:
                undone_reqs.append(req)
        self.stream_output(done_reqs, any(req.return_logprob for req in done_reqs))
        for req in done_reqs:
            release_req_to_metadata_buffer(req, self.req_to_metadata_buffer_idx_allocator)
        self.disagg_prefill_inflight_queue = undone_reqs
        return done_reqs

    def process_prefill_chunk(self):
        if self.chunked_req:
            self.send_kv_chunk(self.chunked_req)

    def send_kv_chunk(self, req, last_chunk=False, end_idx=None):
        page_size = self.token_to_kv_pool_allocator.page_size
        start_idx = req.start_send_idx
        end_idx = end_idx if end_idx is not None else min(len(req.fill_ids), len(req.origin_input_ids))
        if not last_chunk:
            end_idx = end_idx - end_idx % page_size  # the trailing partial page waits for the next send
        if end_idx < start_idx:
            return
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, start_idx:end_idx].cpu().numpy()
        page_indices = kv_to_page_indices(kv_indices, page_size)
        if not req.disagg_kv_sender.should_send_kv_chunk(len(page_indices), last_chunk):
            return
        req.disagg_kv_sender.send(page_indices, None)
        req.start_send_idx = end_idx


__all__ = ["FINISH_ABORT", "FINISH_LENGTH", "PrefillBootstrapQueue", "SchedulerDisaggregationPrefillMixin",
           "release_req_to_metadata_buffer"]
