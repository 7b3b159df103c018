"""Mirrors the decode side of ``sglang/srt/disaggregation/decode.py``: ``DecodeReqToTokenPool``, the
prealloc queue (receiver per request, handshake polling, the token budget, ``_pre_alloc`` through
``alloc_for_decode_prealloc``, ``send_metadata`` with the page ids of the request's KV slots) and the
transfer queue (``KVPoll.Failed`` aborts with 500 and releases the request's KV; ``Success`` commits and
reads the request's metadata row), and the metadata rows: one per request from the preallocation (after
``_pre_alloc``, before ``send_metadata``) until the transfer queue lets the request go.

Left out: TP all-reduce of polls, prefill DP-rank resolution, decode radix cache, HiCache, SWA/Mamba/DSA
state, retraction. The queues take the metadata allocator and buffers as keywords (SGLang: positional).
"""

from dataclasses import dataclass
from http import HTTPStatus

import torch

from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.utils import (FAKE_BOOTSTRAP_HOST, FINISH_ABORT, DisaggregationMode, KVClassType,
                                             TransferBackend, get_kv_class, kv_to_page_indices, prepare_abort)
from sglang.srt.mem_cache.common import release_kv_cache


def _is_fake_transfer(req, server_args):
    return req.bootstrap_host == FAKE_BOOTSTRAP_HOST or (
        req.bootstrap_host is None and server_args.disaggregation_transfer_backend == "fake")


def _bootstrap_addr(req):
    return f"{req.bootstrap_host}:{req.bootstrap_port}"


class DecodeReqToTokenPool:
    def __init__(self, size, max_context_len, device, enable_memory_saver, pre_alloc_size):
        self.size = size
        self._alloc_size = size + pre_alloc_size + 1  # row 0 is padding
        self.max_context_len = max_context_len
        self.device = device
        self.pre_alloc_size = pre_alloc_size
        self.req_to_token = torch.zeros((self._alloc_size, max_context_len), dtype=torch.int32, device=device)
        self.free_slots = list(range(1, self._alloc_size))

    def write(self, indices, values):
        self.req_to_token[indices] = values

    def available_size(self):
        return len(self.free_slots)

    def alloc(self, reqs):
        need = [r for r in reqs if r.req_pool_idx is None]
        if len(need) > len(self.free_slots):
            return None
        for r in need:
            r.req_pool_idx = self.free_slots.pop(0)
        return [r.req_pool_idx for r in reqs]

    def free(self, req):
        assert req.req_pool_idx is not None, "request must have req_pool_idx"
        self.free_slots.append(req.req_pool_idx)
        req.req_pool_idx = None


@dataclass
class DecodeRequest:
    req: object
    kv_receiver: object
    waiting_for_input: bool = False
    metadata_buffer_index: int = -1


class DecodePreallocQueue:
    def __init__(self, req_to_token_pool, token_to_kv_pool_allocator, scheduler, transfer_queue, tree_cache,
                 max_total_num_tokens, num_reserved_decode_tokens, transfer_backend,
                 req_to_metadata_buffer_idx_allocator=None, metadata_buffers=None):
        self.req_to_metadata_buffer_idx_allocator = req_to_metadata_buffer_idx_allocator
        self.metadata_buffers = metadata_buffers
        self.req_to_token_pool = req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator
        self.scheduler = scheduler
        self.transfer_queue = transfer_queue
        self.tree_cache = tree_cache
        self.max_total_num_tokens = max_total_num_tokens
        self.num_reserved_decode_tokens = num_reserved_decode_tokens
        self.transfer_backend = transfer_backend
        self.queue = []
        self.kv_manager = self._init_kv_manager()

    def _init_kv_manager(self):
        kv_args = get_kv_class(self.transfer_backend, KVClassType.KVARGS)()
        kv_args.page_size = self.token_to_kv_pool_allocator.page_size
        pool = self.token_to_kv_pool_allocator.get_kvcache()
        if hasattr(pool, "get_contiguous_buf_infos"):
            kv_args.kv_data_ptrs, kv_args.kv_data_lens, kv_args.kv_item_lens = pool.get_contiguous_buf_infos()
        if self.metadata_buffers is not None:
            kv_args.aux_data_ptrs, kv_args.aux_data_lens, kv_args.aux_item_lens = self.metadata_buffers.get_buf_infos()
        manager_cls = get_kv_class(self.transfer_backend, KVClassType.MANAGER)
        return manager_cls(kv_args, DisaggregationMode.DECODE, self.scheduler.server_args, False)

    def add(self, req, is_retracted=False):
        if self._check_if_req_exceed_kv_capacity(req):
            return
        decode_req = self._create_receiver_and_enqueue(req)
        decode_req.kv_receiver.init(0)  # the stand-in has one prefill DP rank

    def _check_if_req_exceed_kv_capacity(self, req):
        if len(req.origin_input_ids) > self.max_total_num_tokens:
            message = (f"Request {req.rid} exceeds the maximum number of tokens: {len(req.origin_input_ids)} > "
                       f"{self.max_total_num_tokens}")
            prepare_abort(req, message, status_code=HTTPStatus.BAD_REQUEST)
            self.scheduler.stream_output([req], req.return_logprob)
            return True
        return False

    def _create_receiver_and_enqueue(self, req):
        backend = TransferBackend.FAKE if _is_fake_transfer(req, self.scheduler.server_args) else self.transfer_backend
        kv_receiver_class = get_kv_class(backend, KVClassType.RECEIVER)
        kv_receiver = kv_receiver_class(mgr=self.kv_manager, bootstrap_addr=_bootstrap_addr(req),
                                        bootstrap_room=req.bootstrap_room)
        decode_req = DecodeRequest(req=req, kv_receiver=kv_receiver)
        self.queue.append(decode_req)
        return decode_req

    def _update_handshake_waiters(self):
        for decode_req in self.queue:
            poll = decode_req.kv_receiver.poll()
            if poll == KVPoll.WaitingForInput:
                decode_req.waiting_for_input = True
            elif poll == KVPoll.Failed:
                prepare_abort(decode_req.req, f"Decode handshake failed for request {decode_req.req.rid}",
                              status_code=HTTPStatus.INTERNAL_SERVER_ERROR)

    @staticmethod
    def _pre_alloc_fill_len(req):
        return len(req.origin_input_ids) + max(len(req.output_ids) - 1, 0)

    def _allocatable_tokens(self):
        active = len(self.transfer_queue.queue) + len(self.scheduler.running_batch.reqs)
        return self.token_to_kv_pool_allocator.available_size() - self.num_reserved_decode_tokens * active

    def pop_preallocated(self):
        """Pops the requests that got their KV preallocated (FIFO), and the failed ones."""
        self._update_handshake_waiters()
        failed_reqs, preallocated_reqs, indices_to_remove = [], [], set()
        for i, decode_req in enumerate(self.queue):
            if isinstance(decode_req.req.finished_reason, FINISH_ABORT):
                self.scheduler.stream_output([decode_req.req], decode_req.req.return_logprob)
                decode_req.kv_receiver.clear()
                decode_req.kv_receiver = None
                failed_reqs.append(decode_req)
                indices_to_remove.add(i)

        allocatable_tokens = self._allocatable_tokens()
        for i, decode_req in enumerate(self.queue):
            if i in indices_to_remove or not decode_req.waiting_for_input:
                continue
            if self.req_to_token_pool.available_size() <= 0:
                break
            if self.req_to_metadata_buffer_idx_allocator.available_size() <= 0:
                break
            required = self._pre_alloc_fill_len(decode_req.req) + self.num_reserved_decode_tokens
            if required > allocatable_tokens:
                break
            self._pre_alloc(decode_req.req)
            allocatable_tokens = self._allocatable_tokens() - self.num_reserved_decode_tokens * (
                len(preallocated_reqs) + 1)
            origin_input_len = len(decode_req.req.origin_input_ids)
            kv_indices = self.req_to_token_pool.req_to_token[decode_req.req.req_pool_idx][:origin_input_len]
            page_indices = kv_to_page_indices(kv_indices.to(torch.int64), self.token_to_kv_pool_allocator.page_size)
            decode_req.metadata_buffer_index = self.req_to_metadata_buffer_idx_allocator.alloc()
            assert decode_req.metadata_buffer_index is not None
            decode_req.kv_receiver.send_metadata(page_indices.to(torch.int32), decode_req.metadata_buffer_index, [],
                                                 decode_prefix_len=0)
            preallocated_reqs.append(decode_req)
            indices_to_remove.add(i)

        self.queue = [e for i, e in enumerate(self.queue) if i not in indices_to_remove]
        return preallocated_reqs, failed_reqs

    def _pre_alloc(self, req):
        """Preallocates ``req_to_token`` and the KV slots of the request's input; returns the slots."""
        req_pool_indices = self.req_to_token_pool.alloc([req])
        assert req_pool_indices is not None, "req_pool_indices is full! There is a bug in memory estimation."
        fill_len = self._pre_alloc_fill_len(req)
        req.kv_committed_len = fill_len
        kv_loc = alloc_for_decode_prealloc(self.token_to_kv_pool_allocator, req=req, fill_len=fill_len,
                                           delta_len=fill_len, prefix_len=0, total_prefix_len=0, prefix_indices=None,
                                           uses_swa_tail=False, swa_tail_len=0)
        assert kv_loc is not None, f"KV cache is full! Bug in memory estimation. req={req.rid}"
        self.req_to_token_pool.write((req.req_pool_idx, slice(0, len(kv_loc))), kv_loc)
        return kv_loc


def alloc_for_decode_prealloc(allocator, *, req, fill_len, delta_len, prefix_len, total_prefix_len, prefix_indices,
                              uses_swa_tail, swa_tail_len):
    if allocator.page_size == 1:
        return allocator.alloc(delta_len)
    device = allocator.device
    return allocator.alloc_extend(
        prefix_lens=torch.tensor([total_prefix_len], dtype=torch.int64, device=device),
        prefix_lens_cpu=torch.tensor([total_prefix_len], dtype=torch.int64),
        seq_lens=torch.tensor([fill_len], dtype=torch.int64, device=device),
        seq_lens_cpu=torch.tensor([fill_len], dtype=torch.int64),
        last_loc=torch.tensor([-1], dtype=torch.int64, device=device),
        extend_num_tokens=delta_len,
    )


class DecodeTransferQueue:
    def __init__(self, scheduler, tree_cache=None, req_to_metadata_buffer_idx_allocator=None, metadata_buffers=None):
        self.req_to_metadata_buffer_idx_allocator = req_to_metadata_buffer_idx_allocator
        self.metadata_buffers = metadata_buffers
        self.queue = []
        self.scheduler = scheduler
        self.tree_cache = tree_cache

    def add(self, decode_req):
        self.queue.append(decode_req)

    def extend(self, decode_reqs):
        self.queue.extend(decode_reqs)

    def _commit_transfer_to_req(self, decode_req):
        if self.metadata_buffers is not None:  # NOTE: the stand-in's queue may be built without metadata buffers
            output_id, cached_tokens, hidden_states, bootstrap_room = self.metadata_buffers.get_buf(
                decode_req.metadata_buffer_index)
            decode_req.req.output_ids.append(output_id[0].item())
        decode_req.kv_receiver.clear()
        decode_req.kv_receiver = None

    def pop_transferred(self):
        transferred_reqs, indices_to_remove = [], set()
        for i, decode_req in enumerate(self.queue):
            poll = decode_req.kv_receiver.poll()
            if poll == KVPoll.Failed:
                prepare_abort(decode_req.req, f"Decode transfer failed for request {decode_req.req.rid}",
                              status_code=HTTPStatus.INTERNAL_SERVER_ERROR)
                self.scheduler.stream_output([decode_req.req], decode_req.req.return_logprob)
                # release pre-allocated kv cache, but don't insert into the tree since it's failed
                release_kv_cache(decode_req.req, self.tree_cache, is_insert=False)
                decode_req.kv_receiver.clear()
                decode_req.kv_receiver = None
                indices_to_remove.add(i)
            elif poll == KVPoll.Success:
                self._commit_transfer_to_req(decode_req)
                indices_to_remove.add(i)
                if not isinstance(decode_req.req.finished_reason, FINISH_ABORT):
                    transferred_reqs.append(decode_req.req)
        for i in indices_to_remove if self.req_to_metadata_buffer_idx_allocator is not None else ():
            idx = self.queue[i].metadata_buffer_index
            assert idx != -1
            self.req_to_metadata_buffer_idx_allocator.free(idx)
        self.queue = [e for i, e in enumerate(self.queue) if i not in indices_to_remove]
        return transferred_reqs
