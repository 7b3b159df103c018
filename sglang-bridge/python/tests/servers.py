"""SGLang's own ``TokenizerManager`` and ``Scheduler`` for the request paths the hooks wrap, built without
their ``__init__`` (which loads a model, claims GPUs and opens sockets): the attributes those paths read are
set as a running server sets them, and only the I/O around them is replaced at the instance (the zmq send
to the scheduler, the wait for its response, the model's tokenizer). Everything else that runs is SGLang's
code: ``generate_request``, ``_create_tokenized_object``, ``handle_generate_request``, ``Req`` construction,
input validation and ``_add_request_to_queue``."""

import asyncio
import types

from sglang.srt.disaggregation.utils import DisaggregationMode
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.runtime_context import get_context
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.utils.aio_rwlock import RWLock


def publish_server_args(**overrides):
    """Publishes SGLang's configuration bags (defaults, plus ``overrides``) as a server's launch does."""
    get_context().override_server_args(**overrides).install()


def tokenizer_manager(vocab_size=100):
    """A TokenizerManager whose requests go to ``tm.sent`` (what crosses to the scheduler: SGLang's own
    ``_send_one_request`` and ``_dispatch_to_scheduler`` up to the zmq socket) and get one response each."""
    tm = TokenizerManager.__new__(TokenizerManager)
    tm.sent = []
    tm.server_args = types.SimpleNamespace(enable_strict_thinking=False, language_only=False, tokenizer_worker_num=1)
    tm.enable_metrics = False
    tm.model_config = types.SimpleNamespace(vocab_size=vocab_size)
    tm.preferred_sampling_params, tm.sampling_params_class, tm.tokenizer = None, SamplingParams, None
    tm.enable_priority_scheduling, tm.default_priority_value = False, None
    tm.rid_to_state, tm.enable_trace, tm.disaggregation_mode = {}, False, DisaggregationMode.NULL
    tm.request_logger = types.SimpleNamespace(log_received_request=lambda *a: None)
    tm.auto_create_handle_loop = lambda: None

    async def tokenize(obj):  # the model's tokenizer: the request carries token ids already
        return tm._create_tokenized_object(obj, obj.text, obj.input_ids)

    async def respond(obj, request):
        yield {"rid": obj.rid}

    def dispatch(obj, **kwargs):  # the zmq socket's send; the scheduler's receiver unwraps what was pickled for it
        if hasattr(obj, "unwrap_pickle_fields"):  # NOTE: tokenized requests carry pickled fields; an abort none
            obj.unwrap_pickle_fields()
        tm.sent.append(obj)

    tm.tokenizer_ipc_name = None
    tm.send_to_scheduler = types.SimpleNamespace(send_pyobj=dispatch)
    tm.cuda_vmm_feature_transport = types.SimpleNamespace(prepare_for_dispatch=lambda mm_inputs: [],
                                                          cancel_for_dispatch=lambda items: None)
    tm._tokenize_one_request, tm._wait_one_response = tokenize, respond
    return tm


def send(tm, obj, request):
    """Runs ``tm.generate_request(obj, request)`` to its end, as an HTTP handler does."""

    async def go():
        tm.is_pause_cond, tm.is_pause, tm.model_update_lock = asyncio.Condition(), False, RWLock()
        return [x async for x in tm.generate_request(obj, request)]

    return asyncio.run(go())


def scheduler(page_size=4, max_total_num_tokens=256, max_req_len=64):
    """A Scheduler (no disaggregation) whose admitted requests land in ``waiting_queue``."""
    s = Scheduler.__new__(Scheduler)
    s.enable_session_radix_cache, s.disaggregation_mode, s.dllm_config, s.tokenizer = (
        False, DisaggregationMode.NULL, None, None)
    s.model_config = types.SimpleNamespace(vocab_size=100, hf_eos_token_id=None)
    s.metrics_reporter = types.SimpleNamespace(enable_metrics=False)
    s.spec_algorithm, s.page_size, s.max_new_tokens_limit = SpeculativeAlgorithm.from_string(None), page_size, None
    s.max_total_num_tokens, s.max_req_len, s.max_req_input_len = max_total_num_tokens, max_req_len, max_req_len - 4
    s.enable_priority_scheduling, s.max_queued_requests, s.enable_hicache_storage = False, None, False
    s.grammar_manager = types.SimpleNamespace(process_req_with_grammar=lambda req: False)  # no grammar backend
    s.waiting_queue = []
    return s


def radix_cache(allocator, req_to_token_pool=None, max_context_len=128):
    """SGLang's default prefix cache (``UnifiedRadixCache``, full attention) over ``allocator``."""
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    rows = req_to_token_pool or ReqToTokenPool(size=16, max_context_len=max_context_len, device="cpu",
                                               enable_memory_saver=False)
    return UnifiedRadixCache(CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=allocator,
                                             page_size=allocator.page_size, eviction_policy="lru",
                                             tree_components=(ComponentType.FULL,)))


def prefill(tree_cache, reqs, running=None):
    """One prefill step as SGLang's scheduler runs it: each request matched against the cache and admitted
    by ``PrefillAdder`` (in order, skipping those it does not admit), then ``ScheduleBatch.init_new`` and
    ``prepare_for_extend`` (which allocates through ``alloc_for_extend``). Returns the batch (None if none
    was admitted); needs ``publish_server_args(attention_backend="torch_native")`` (no Triton here)."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import PrefillAdder

    allocator = tree_cache.token_to_kv_pool_allocator
    running = running or ScheduleBatch(reqs=[])
    adder = PrefillAdder(allocator.page_size, tree_cache, allocator, running, 0.5, 10 ** 6, None)
    for req in reqs:
        req.init_next_round_input(tree_cache)
        adder.add_one_req(req, has_chunked_req=False, truncation_align_size=None)
    if not adder.can_run_list:
        return None
    batch = ScheduleBatch.init_new(adder.can_run_list, tree_cache.req_to_token_pool, allocator, tree_cache,
                                   types.SimpleNamespace(vocab_size=100, is_encoder_decoder=False), False,
                                   SpeculativeAlgorithm.from_string(None))
    batch.prepare_for_extend()
    return batch


def assign_req_to_token_pool_on_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                    batch_size):
    """SGLang's ``assign_req_to_token_pool`` Triton kernel (no GPU here) as plain tensor code, for
    ``allocation.assign_req_to_token_pool_func`` (speculative decoding's allocation writes its rows with it)."""
    pt = 0
    for i in range(batch_size):
        s, e = int(start_offset[i]), int(end_offset[i])
        req_to_token[int(req_pool_indices[i]), s:e] = out_cache_loc[pt:pt + e - s].to(req_to_token.dtype)
        pt += e - s


def request(rid, tokens, tenant=None, max_new_tokens=4, **kwargs):
    """SGLang's Req for ``tokens`` (a list of ids), stamped with ``tenant`` as the scheduler hook does."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req

    req = Req(rid, "", array("q", tokens), SamplingParams(max_new_tokens=max_new_tokens), **kwargs)
    req.kvshield_tenant = tenant
    return req


def single_rank():
    """SGLang's parallel state of a one-rank server, through its own test injection (``get_parallel().override``);
    a context manager. Collectives (the disaggregation queues' poll agreement) use a one-process gloo group
    (:func:`one_process_group`)."""
    from sglang.srt.runtime_context import get_parallel

    return get_parallel().override(world_size=1, world_rank=0, tp_size=1, tp_rank=0, pp_size=1, pp_rank=0,
                                   attn_tp_size=1, attn_tp_rank=0, attn_cp_size=1, attn_cp_rank=0, attn_dp_size=1,
                                   attn_dp_rank=0, dcp_enabled=False)


def one_process_group():
    """torch.distributed's default group over this process alone (gloo), as SGLang's collectives need one."""
    import socket

    import torch.distributed as dist

    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def disagg_scheduler(allocator, backend, streamed, max_total_num_tokens=None):
    """The scheduler state SGLang's disaggregation queues read (``DecodePreallocQueue``/``DecodeTransferQueue``/
    ``PrefillBootstrapQueue`` and the prefill mixin), one rank; streamed requests are appended to ``streamed``."""
    return types.SimpleNamespace(
        server_args=types.SimpleNamespace(disaggregation_decode_enable_radix_cache=False, disable_radix_cache=True,
                                          disaggregation_transfer_backend=backend, disaggregation_ib_device=None),
        output_streamer=types.SimpleNamespace(stream_output=lambda reqs, *a, **k: streamed.extend(reqs)),
        stream_output=lambda reqs, *a, **k: streamed.extend(reqs),
        running_batch=types.SimpleNamespace(reqs=[], batch_is_full=False), enable_priority_scheduling=False,
        enable_hisparse=False, enable_decode_hicache=False, enable_hicache_storage=False, enable_staging=False,
        spec_algorithm=SpeculativeAlgorithm.from_string(None), token_to_kv_pool_allocator=allocator,
        tp_worker=types.SimpleNamespace(is_hybrid_swa=False, model_runner=types.SimpleNamespace(
            kv_cache_dtype_str="float32", effective_max_total_num_tokens=max_total_num_tokens or allocator.size)),
        ps=types.SimpleNamespace(dp_rank=0, tp_rank=0, pp_rank=0, pp_size=1, gpu_id=0),
        model_config=types.SimpleNamespace(num_hidden_layers=2, get_total_num_kv_heads=lambda: 1),
        metrics_reporter=types.SimpleNamespace(enable_metrics=False), attn_cp_cpu_group=None, attn_tp_cpu_group=None,
        disagg_prefill_inflight_queue=[], disagg_prefill_pending_chunk_rids=set(), waiting_queue=[],
        schedule_low_priority_values_first=False, sliding_window_size=None, enable_overlap=False, last_batch=None)
