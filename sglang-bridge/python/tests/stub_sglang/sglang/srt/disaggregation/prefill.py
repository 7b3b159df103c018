"""Mirrors the prefill side of ``sglang/srt/disaggregation/prefill.py``: the bootstrap queue (a KV
sender per request, a metadata row and the sender's ``init`` once bootstrapped) and the scheduler
mixin's ``send_kv_chunk`` (page-aligned chunks; the metadata row is set before the last chunk's send).

Stock behaviour before the upstream handoff-isolation fix: every request is bootstrapped (no
finished/capacity check in ``add``). Left out: handshake polling (``pop_bootstrapped`` takes every
queued request), TP/PP/DP, state buffers. The queue is built with the pools it registers (SGLang builds
its ``KVArgs`` the same way in ``_init_kv_manager``); without them it makes no senders.
"""

from http import HTTPStatus

from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.utils import (FAKE_BOOTSTRAP_HOST, FINISH_ABORT, KVClassType, TransferBackend,
                                             get_kv_class, kv_to_page_indices, kv_to_page_num, prepare_abort)
from sglang.srt.mem_cache.common import release_kv_cache


class PrefillBootstrapQueue:
    def __init__(self, scheduler, token_to_kv_pool=None, req_to_metadata_buffer_idx_allocator=None,
                 metadata_buffers=None, bootstrap_port=8998, transfer_backend=TransferBackend.FAKE):
        self.scheduler = scheduler
        self.token_to_kv_pool = token_to_kv_pool
        self.req_to_metadata_buffer_idx_allocator = req_to_metadata_buffer_idx_allocator
        self.metadata_buffers = metadata_buffers
        self.bootstrap_port = bootstrap_port
        self.transfer_backend = transfer_backend
        self.queue = []
        self.kv_manager = self._init_kv_manager() if token_to_kv_pool is not None else None

    def _init_kv_manager(self):
        kv_args = get_kv_class(self.transfer_backend, KVClassType.KVARGS)()
        kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = self.token_to_kv_pool.get_contiguous_buf_infos()
        kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = self.metadata_buffers.get_buf_infos()
        kv_args.page_size = self.token_to_kv_pool.page_size
        manager_cls = get_kv_class(self.transfer_backend, KVClassType.MANAGER)
        return manager_cls(kv_args, None, None, False)

    def add(self, req, num_kv_heads):
        if self.kv_manager is not None:
            backend = TransferBackend.FAKE if req.bootstrap_host == FAKE_BOOTSTRAP_HOST else self.transfer_backend
            kv_sender_class = get_kv_class(backend, KVClassType.SENDER)
            req.disagg_kv_sender = kv_sender_class(mgr=self.kv_manager,
                                                   bootstrap_addr=f"{req.bootstrap_host}:{self.bootstrap_port}",
                                                   bootstrap_room=req.bootstrap_room, dest_tp_ranks=[0], pp_rank=0)
        self.queue.append(req)

    def pop_bootstrapped(self):
        bootstrapped, self.queue = self.queue, []
        for req in bootstrapped:
            req.metadata_buffer_index = self.req_to_metadata_buffer_idx_allocator.alloc()
            assert req.metadata_buffer_index is not None
            num_pages = kv_to_page_num(len(req.origin_input_ids), self.token_to_kv_pool.page_size)
            req.disagg_kv_sender.init(num_pages, req.metadata_buffer_index)
        return bootstrapped


# ---------------------------------------------------------------- the scheduler's prefill mixin
# Mirrors ``SchedulerDisaggregationPrefillMixin`` of sglang/srt/disaggregation/prefill.py: the KV of a
# request is handed to its sender chunk by chunk (``send_kv_chunk``: page ids of the request's
# req_to_token row, copied to the host by SGLang itself, a prefix-cache hit's slots included, the
# trailing partial page held back until the last chunk), finished requests go
# to the inflight queue, and ``process_disagg_prefill_inflight_queue`` polls each sender: on Success or
# Failed SGLang releases the request's KV (``release_kv_cache``) and streams its output. Logprobs,
# metrics, PP consensus and state (Mamba/SWA/NSA) payloads are left out.


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
    ``disagg_metadata_buffers``, ``disagg_prefill_inflight_queue``, ``req_to_metadata_buffer_idx_allocator``,
    ``stream_output``."""

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
            # if not the last chunk and the last page is partial, delay the last partial page to the next send
            end_idx = end_idx - end_idx % page_size
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, start_idx:end_idx].cpu().numpy()
        req.start_send_idx = end_idx
        if last_chunk:
            self.disagg_metadata_buffers.set_buf(req)
        page_indices = kv_to_page_indices(kv_indices, page_size)
        if len(page_indices) == 0:  # SGLang logs and skips an empty chunk
            return
        req.disagg_kv_sender.send(page_indices)


__all__ = ["FINISH_ABORT", "FINISH_LENGTH", "PrefillBootstrapQueue", "SchedulerDisaggregationPrefillMixin",
           "release_req_to_metadata_buffer"]
