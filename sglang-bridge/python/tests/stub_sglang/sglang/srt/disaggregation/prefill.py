"""Mirrors the prefill side of ``sglang/srt/disaggregation/prefill.py``: the bootstrap queue (a KV
sender per request, a metadata row and the sender's ``init`` once bootstrapped) and the scheduler
mixin's ``send_kv_chunk`` (page-aligned chunks; the metadata row is set before the last chunk's send).

Stock behaviour before the upstream handoff-isolation fix: every request is bootstrapped (no
finished/capacity check in ``add``). Left out: handshake polling (``pop_bootstrapped`` takes every
queued request), TP/PP/DP, state buffers. The queue is built with the pools it registers (SGLang builds
its ``KVArgs`` the same way in ``_init_kv_manager``); without them it makes no senders.
"""

from sglang.srt.disaggregation.utils import (FAKE_BOOTSTRAP_HOST, KVClassType, TransferBackend, get_kv_class,
                                             kv_to_page_indices, kv_to_page_num)


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


class SchedulerDisaggregationPrefillMixin:
    """The prefill scheduler's KV send (needs ``req_to_token_pool``, ``token_to_kv_pool_allocator`` and
    ``disagg_metadata_buffers``)."""

    def send_kv_chunk(self, req, last_chunk=False, end_idx=None):
        page_size = self.token_to_kv_pool_allocator.page_size
        start_idx = req.start_send_idx
        end_idx = end_idx if end_idx is not None else min(len(req.fill_ids), len(req.origin_input_ids))
        if not last_chunk:
            # if not the last chunk and the last page is partial, delay the last partial page to the next send
            end_idx = end_idx - end_idx % page_size
        kv_indices = self.req_to_token_pool.req_to_token[req.req_pool_idx, start_idx:end_idx].to("cpu").numpy()
        req.start_send_idx = end_idx
        if last_chunk:
            self.disagg_metadata_buffers.set_buf(req)
        page_indices = kv_to_page_indices(kv_indices, page_size)
        req.disagg_kv_sender.send(page_indices)
