"""SGLang's diffusion-LLM scheduling (``dllm.mixin.scheduler.SchedulerDllmMixin``: ``get_new_batch_dllm``,
``process_batch_result_dllm``, ``DllmManager``, and ``Scheduler.abort_request``) on a ``Scheduler`` built without its
``__init__``, over kvshield's allocator and SGLang's radix cache on the CPU. Each step is
``Scheduler.get_next_batch_to_run``'s dLLM part (finished requests filtered, the last round's requests stashed into
the cache, the new batch built and prepared) and the result; the forward is replaced by its effect: it writes each
request's KV at the slots its round allocated (every byte the request's own value) and returns what the dLLM
algorithm returns (``DllmAlgorithm._run_sync``: each block's masked tail, decoded as token 7).

The oracle, at each step and for every request of the batch: every slot of its sequence (its ``req_to_token`` row up
to its round's end: its own earlier rounds, the prefix the cache matched and this round) reads back its own value,
and no tenant owns more pages than its quota."""

import types

import torch

import servers
from sglang.srt.dllm.config import DllmConfig
from sglang.srt.dllm.mixin.scheduler import DllmManager
from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.io_struct import AbortReq
from sglang.srt.managers.schedule_batch import ScheduleBatch
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

MASK = 99


class World:
    def __init__(self, allocator, kv, block_size, quotas, max_running_requests=4, fdfo=False):
        import jpype

        servers.publish_server_args(attention_backend="torch_native", pp_max_micro_batch_size=max_running_requests)
        self.alloc, self.kv, self.quotas = allocator, kv, dict(quotas)
        policy = jpype.JClass("dev.kvshield.tenant.TenantPolicy")
        for tenant, pages in self.quotas.items():
            allocator._j.pool().tenants().register(tenant, policy.withQuota(pages))
        self.cache = servers.radix_cache(allocator)
        self.config = DllmConfig("LowConfidence", {}, block_size, MASK, max_running_requests, fdfo)
        self.attempts = set()  # FDFO: (rid, block start) of the blocks whose first forward left them unresolved
        s = self.s = Scheduler.__new__(Scheduler)
        s.dllm_config, s.dllm_manager = self.config, DllmManager(self.config)
        s.waiting_queue, s.enable_priority_preemption, s.enable_priority_scheduling = [], False, False
        s.page_size, s.tree_cache, s.token_to_kv_pool_allocator = allocator.page_size, self.cache, allocator
        s.req_to_token_pool = self.cache.req_to_token_pool
        s.new_token_ratio_tracker = types.SimpleNamespace(current=0.5)
        s.max_prefill_tokens, s.chunked_prefill_size, s.is_mixed_chunk = 10 ** 6, None, False
        s.priority_scheduling_preemption_threshold, s.truncation_align_size = 10, None
        s.policy = types.SimpleNamespace(calc_priority=lambda queue: None)
        s.model_config = types.SimpleNamespace(vocab_size=100, is_encoder_decoder=False)
        s.enable_overlap, s.spec_algorithm = False, SpeculativeAlgorithm.from_string(None)
        s.output_streamer = types.SimpleNamespace(stream_output=lambda reqs, *a, **k: None)
        s.metrics_reporter = types.SimpleNamespace(num_generated_tokens=0, report_prefill_stats=lambda **k: None)
        s.running_batch, s.last_batch, s.chunked_req, s.mm_receiver = ScheduleBatch(reqs=[]), None, None, None
        s.enable_hicache_storage, s.disaggregation_mode = False, DisaggregationMode.NULL
        s.ps = types.SimpleNamespace(pp_size=1)
        self.aborts_sent = []
        s.ipc_channels = types.SimpleNamespace(send_to_tokenizer=types.SimpleNamespace(
            send_output=lambda out, req: self.aborts_sent.append(req.rid)))
        s.grammar_manager = types.SimpleNamespace(abort_requests=lambda recv_req: None)
        self.values, self.max_owned = {}, {t: 0 for t in self.quotas}

    def request(self, rid, tokens, tenant, max_new_tokens, value):
        """A dLLM request of ``tenant``; the forward writes ``value`` into every slot of its KV."""
        req = servers.request(rid, tokens, tenant, max_new_tokens=max_new_tokens, dllm_config=self.config)
        req.sampling_params.normalize(None)  # as the tokenizer does (stop strings)
        self.values[rid] = float(value)
        return req

    def step(self):
        """One scheduler iteration; returns the rids of the batch run (None: nothing ran)."""
        s = self.s
        s.dllm_manager.filter_finished_reqs()
        for req in s.dllm_manager.staging_queue:
            if not self.config.first_done_first_out_mode:
                s.stash_chunked_request(req)
            elif not req.dllm_incomplete_ids:  # FDFO: an unresolved block keeps its row and KV for the next round
                s.stash_chunked_request(req)
                s.req_to_token_pool.free(req)
        with servers.single_rank():
            batch = s.get_new_batch_dllm(s.running_batch)
        self._tally()
        if batch is None:
            return None
        s.last_batch = batch
        done, tails, accepted, at = [], [], [], 0
        for req, n in zip(batch.reqs, batch.extend_lens):
            for b in self.kv.buffers():
                b[batch.out_cache_loc[at:at + n]] = self.values[req.rid]
            at += n
            end = req.extend_range.end
            row = s.req_to_token_pool.req_to_token[req.req_pool_idx, :end].to(torch.int64)
            got = self.kv.read(row)
            assert bool((got == self.values[req.rid]).all()), (
                f"request {req.rid} reads KV that is not its own: values {sorted(set(got.flatten().tolist()))}")
            block = list(req.full_untruncated_fill_ids[req.extend_range.start:end])
            start = sum(1 for t in block if t != MASK)
            tails.append(torch.full((len(block) - start,), 7, dtype=torch.int64))
            done.append(start == len(block))
            # FDFO (DllmAlgorithm._run_fdfo): the whole block back; a masked block's first forward leaves it unresolved
            first = MASK in block and (req.rid, req.extend_range.start) not in self.attempts
            self.attempts.add((req.rid, req.extend_range.start))
            accepted.append((0 if first else len(block), block if first else [7 if t == MASK else t for t in block]))
        if self.config.first_done_first_out_mode:
            result = types.SimpleNamespace(copy_done=None, next_token_ids=[b for _, b in accepted],
                                           dllm_algo_state=[None if n else "unresolved" for n, _ in accepted],
                                           accept_length_per_req_cpu=[n for n, _ in accepted], can_run_cuda_graph=False)
        else:
            result = types.SimpleNamespace(copy_done=None, next_token_ids=[] if all(done) else tails,
                                           dllm_algo_state=None, accept_length_per_req_cpu=None,
                                           can_run_cuda_graph=False)
        s.process_batch_result_dllm(batch, result)
        self.alloc.end_step()
        self._tally()
        return [r.rid for r in batch.reqs]

    def _tally(self):
        for tenant, quota in self.quotas.items():
            owned = self.alloc.tenant_owned_pages(tenant)
            assert 0 <= owned <= quota, f"tenant {tenant} owns {owned} pages; its quota is {quota}"
            self.max_owned[tenant] = max(self.max_owned[tenant], owned)

    def abort(self, rid, tenant):
        """A client's abort of ``rid`` as ``tenant``'s tokenizer sends it (sealed for that tenant)."""
        from kvshield_sglang import engine_hooks
        from kvshield_sglang.tenants import TenantChannel

        sealed = TenantChannel.from_rank_dir().seal(engine_hooks._ABORT, tenant, rid)
        with servers.single_rank():
            self.s.abort_request(AbortReq(rid=sealed))

    def evict_cache(self):
        """The cache's pages evicted (as pool pressure would); every unlocked page goes back to the pool."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        self.cache.evict(EvictParams(num_tokens=self.alloc.size))
        self.alloc.end_step()
