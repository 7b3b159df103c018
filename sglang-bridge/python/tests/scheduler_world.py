"""Scheduler-level scenarios on the real SGLang, on CPU, with no model forward.

A :class:`World` is one scheduler process's memory on SGLang's own classes: a ``MHATokenToKVPool`` (CPU
tensors, small enough that pages are reused every few steps), a ``ReqToTokenPool``, the KV allocator
SGLang's ``KVCacheConfigurator`` would build (stock, or kvshield's once the plug-in's ``load()`` replaced
the classes, configured from the environment as in a server), a tree cache (``UnifiedRadixCache``, the
default; ``RadixCache``; ``ChunkCache``), and SGLang's ``Scheduler`` built without its ``__init__`` (see
:mod:`servers`). Each :meth:`World.step` is one iteration of ``Scheduler.event_loop_normal``: requests
arrive through ``handle_generate_request`` (the tokenizer side sealed the tenant, as in a server), aborts
through ``abort_request``, then SGLang's ``get_next_batch_to_run`` (admission by ``PrefillAdder``,
``prepare_for_extend``/``alloc_for_extend``, chunked prefill and ``cache_unfinished_req``,
``update_running_batch`` with ``retract_decode`` and ``prepare_for_decode``/``alloc_for_decode``,
eviction), the forward, and ``process_batch_result`` (``release_kv_cache`` on finish and abort).

The forward is the driver's: at the slots SGLang assigned (``out_cache_loc``) it writes, into every K and V
tensor of every layer, a pattern naming the token's tenant, request, position and token id
(:func:`pattern`). The :class:`Oracle` then reads every live request's KV back at its ``req_to_token``
row after every step: a position must hold exactly the bytes it held when the request first saw it, and
a position the request sees for the first time (its own write, a prefix hit, a cache dedup) must hold
the same token at the same position computed by a request of the same tenant. Freshly allocated slots
are read before the write: another tenant's bytes there are residue.

Scenarios (:func:`scenarios_for`): the main workload (~150 requests of two tenants with prefix hits,
chunked prefill, client aborts, eviction and retraction under memory pressure) on 6 configurations, stale
frees of a finished request's slots once a live request of the other tenant holds them
(:class:`StaleFree`), two live requests of different tenants with the same rid, aborts between prefill
chunks, retraction under pressure, and the decode server of a prefill/decode split (:class:`PdWorld`:
SGLang's prealloc and transfer queues, commit, decode, decode retraction). Each oracle has a planted-bug
twin (the "planted bugs" section). ``main`` runs one side (stock SGLang or SGLang with the plug-in) and
prints ``RESULTS <json>``: scenario -> [pass|fail|error, message], plus every run's numbers.

Index tensors say they live on ``cuda:0`` (:class:`DeviceIndices`), so kvshield takes the paths it takes on
a GPU server; SGLang's two Triton kernels of the paged allocator run as CPU code (:func:`cpu_paged_kernels`).
"""

import itertools
import os
import pickle
import random
import types

import torch

import servers
from fakes import MHAPool, widened_index

TENANTS = ("acme", "globex")  # tenant codes 1 and 2 in the pattern (0: never written, or scrubbed)
TENANT_HEADER = "X-Tenant"
LAYERS, HEAD_DIM = 2, 4
VOCAB = 8192
CONTEXT = 128


def code_of(tenant):
    return TENANTS.index(tenant) + 1


def pattern(codes, serials, positions, tokens):
    """The KV the driver writes for tokens, buffer 0's part: ``(n, HEAD_DIM)`` floats, per token
    ``[tenant code, request serial, position, token * 16]`` (exact in float32); buffer ``b`` adds ``b`` to
    the last entry (:func:`buffer_offsets`), so every K and V tensor of every layer is distinct."""
    return torch.stack([codes, serials, positions, tokens * 16], dim=1).to(torch.float32)


def buffer_offsets(buffers):
    off = torch.zeros((buffers, 1, HEAD_DIM))
    off[:, 0, 3] = torch.arange(buffers, dtype=torch.float32)
    return off


class Track:
    """What the driver knows of one request: its tenant (the workload's truth, never read from SGLang),
    serial, the tokenizer worker its client sent it through, and the oracle's ledger: per position, the serial
    whose bytes it holds (-1: bytes that were wrong when first seen) and the slot it read them at."""

    def __init__(self, req, tenant, serial, tokenizer):
        self.req, self.tenant, self.code, self.serial = req, tenant, code_of(tenant), serial
        self.tokenizer = tokenizer
        self.arrived = 0  # the step the request arrived at
        self.owner = torch.empty((0,), dtype=torch.int64)
        self.slots = torch.empty((0,), dtype=torch.int64)
        self._tokens = torch.empty((0,), dtype=torch.int64)

    def tokens(self, n):
        """Token ids of positions ``[0, n)`` (prompt, then output; rebuilt when they change)."""
        ids = self.req.origin_input_ids + self.req.output_ids
        cached = self._tokens
        if len(cached) < n or (len(cached) and int(cached[0]) != ids[0]) or len(cached) > len(ids):
            cached = self._tokens = torch.tensor(ids, dtype=torch.int64)
        return cached[:n]


class Oracle:
    """Counts isolation violations: positions of live requests whose KV is not exactly their own (``reads``;
    each position once while it stays at the same slot), and freshly allocated slots showing another
    tenant's bytes (``residue``). Keeps the first messages of each kind."""

    KEEP = 3  # first messages kept per kind

    def __init__(self, world):
        self.world = world
        self.reads = 0
        self.residue = 0
        self.checks = 0
        self.ledgered = set()
        self.kept = {"read": [], "residue": []}

    @property
    def messages(self):
        return [f"{kind}: {m}" for kind, ms in self.kept.items() for m in ms]

    def _note(self, kind, msg):
        if len(self.kept[kind]) < self.KEEP:
            self.kept[kind].append(msg)

    def fresh(self, batch):
        """Before the forward writes: the batch's newly allocated slots show no other tenant's bytes."""
        w = self.world
        slots, codes = w.batch_slots(batch)
        if not len(slots):
            return
        got = w.kv.k_buffer[0][slots, 0, 0].to(torch.int64)
        bad = (got != 0) & (got != codes)
        n = int(bad.sum())
        if n:
            self.residue += n
            i = int(bad.nonzero()[0])
            self._note("residue", f"step {w.steps}: fresh slot {int(slots[i])} for tenant code {int(codes[i])} "
                                  f"holds tenant code {int(got[i])}'s bytes ({n} slots this step)")

    def check_all(self):
        """After the step, every live request reads back its KV at its ``req_to_token`` row, all at once.
        A position seen before at the same slot must hold exactly the bytes seen then; a position new to
        the request (or at a new slot: its own write, a prefix hit, a cache dedup) must hold, in every
        buffer, the same token at the same position written by a request of the same tenant."""
        self.checks += 1
        w = self.world
        tracks = [t for t in w.live() if int(t.req.kv_committed_len) > 0]
        for t in sorted(self.ledgered - set(tracks), key=lambda t: t.serial):  # released: nothing to expect
            if w.done(t):
                w.released.append((t, t.slots))
            t.owner, t.slots = t.owner[:0], t.slots[:0]
        self.ledgered = set(tracks)
        if not tracks:
            return
        lens = [int(t.req.kv_committed_len) for t in tracks]
        rows = w.host_rows
        slots = torch.cat([rows[t.req.req_pool_idx, :n] for t, n in zip(tracks, lens)]).to(torch.int64)
        tokens = torch.cat([t.tokens(n) for t, n in zip(tracks, lens)])
        positions = torch.cat([torch.arange(n) for n in lens])
        codes = torch.cat([torch.full((n,), t.code) for t, n in zip(tracks, lens)])
        owners, ledger_slots = [], []
        for t, n in zip(tracks, lens):
            k = min(len(t.owner), n)
            owners.append(torch.cat([t.owner[:k], torch.zeros(n - k, dtype=torch.int64)]))
            ledger_slots.append(torch.cat([t.slots[:k], torch.full((n - k,), -1, dtype=torch.int64)]))
        owners, ledger_slots = torch.cat(owners), torch.cat(ledger_slots)
        got = torch.stack([b[slots, 0, :] for b in w.kv.buffers()]) - w.offsets
        same_slot = slots == ledger_slots
        stable_ok = (got == pattern(codes, owners, positions, tokens)).all(dim=2).all(dim=0)
        seen_serial = got[0, :, 1].to(torch.int64)
        seen_code = got[0, :, 0].to(torch.int64)
        consistent = (got == pattern(seen_code, seen_serial, positions, tokens)).all(dim=2).all(dim=0)
        tenant_codes = w.serial_codes()
        known = (seen_serial > 0) & (seen_serial < len(tenant_codes))
        writer_code = torch.where(known, tenant_codes[seen_serial.clamp(0, len(tenant_codes) - 1)], -1)
        new_ok = consistent & (seen_code == codes) & (writer_code == codes)
        ok = torch.where(same_slot, stable_ok, new_ok)
        fresh_bad = ~ok & ~(same_slot & (owners == -1))  # a position already found wrong counts once
        nbad = int(fresh_bad.sum())
        if nbad:
            self.reads += nbad
            i = int(fresh_bad.nonzero()[0])
            t = tracks[next(j for j, c in enumerate(itertools.accumulate(lens)) if i < c)]
            self._note("read", f"step {w.steps}: request {t.req.rid} (tenant {t.tenant}, serial {t.serial}) position "
                               f"{int(positions[i])} at slot {int(slots[i])} reads [tenant code, serial, position, "
                               f"token*16] = {[int(x) for x in got[0, i].tolist()]}, expected tenant code {t.code}, "
                               f"token {int(tokens[i])}"
                               + (f", serial {int(owners[i])} (seen there before)" if bool(same_slot[i]) else "")
                               + f" ({nbad} new wrong positions this step)")
        new_owner = torch.where(same_slot, owners, torch.where(ok, seen_serial, -1))
        for t, o, sl in zip(tracks, torch.split(new_owner, lens), torch.split(slots, lens)):
            t.owner, t.slots = o, sl


class Inert:
    """A scheduler component the memory paths call but that moves no memory (metrics, tracing, output
    transport): every method is a no-op; counters read as 0."""

    def __init__(self, **attrs):
        self.__dict__.update(attrs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *a, **k: None


class ToTokenizer(Inert):
    """The scheduler's channel back to the tokenizer: the requests it reported aborted."""

    def __init__(self):
        super().__init__()
        self.aborted = {}

    def send_output(self, out, req=None, *a, **k):
        if req is not None:
            self.aborted[id(req)] = getattr(out, "rid", None)


class Config(types.SimpleNamespace):
    """One configuration: ``allocator`` ('stock' or 'kvshield'), ``cache`` ('unified', 'radix', 'chunk'),
    ``page_size``, pool ``size`` in tokens, request rows, chunked prefill size, kvshield ``level``, and
    ``disagg`` ('decode' for the decode server of a prefill/decode split, else None)."""

    def __init__(self, allocator, cache, page_size, size=160, rows=10, chunk=16, level="ZERO", max_prefill=64,
                 conservativeness=0.1, disagg=None):
        super().__init__(allocator=allocator, cache=cache, page_size=page_size, size=size, rows=rows, chunk=chunk,
                         level=level, max_prefill=max_prefill, conservativeness=conservativeness, disagg=disagg)


class DeviceIndices(torch.Tensor):
    """SGLang's ``req_to_token`` table, and every index tensor cut from it (rows, prefix indices, tree node
    values), as they are on a GPU server as far as an allocator can tell: ``device`` says ``cuda:0``, so
    kvshield takes its production paths for device indices (deferred frees staged by a non-blocking copy
    and resolved at the step boundary, a request's segment freed from its page list), while the values
    stay in host memory so SGLang's own tensor code runs here. kvshield's copies and events go through
    :class:`fakes.FakeCuda` (:func:`device_shaped_indices`)."""

    CUDA = torch.device("cuda", 0)
    INDEXING = (torch.Tensor.__getitem__, torch.Tensor.__setitem__)

    @property
    def device(self):
        return DeviceIndices.CUDA

    @classmethod
    def __torch_function__(cls, func, types_, args=(), kwargs=None):
        # NOTE: torch 2 indexes with int32 tensors (SGLang's req_to_token rows are int32); this machine's 1.13
        # does not, so such an index is widened here (values unchanged).
        if func in cls.INDEXING and len(args) > 1:
            args = (args[0], widened_index(args[1]), *args[2:])
        return super().__torch_function__(func, types_, args, kwargs or {})


def _to_device_shaped(to):
    """``Tensor.to`` where a move to ``cuda:0`` (this machine has no CUDA) keeps the values on the host as
    :class:`DeviceIndices`: code that moves a host tensor next to a device index (``x.to(index.device)``)
    runs as on a GPU."""

    def move(self, *args, **kwargs):
        target = kwargs.get("device", args[0] if args else None)
        if isinstance(target, (torch.device, str)) and torch.device(target).type == "cuda":
            kwargs.pop("device", None)
            rest = args[1:] if args and args[0] is target else args
            out = to(self, *rest, **kwargs) if rest or {k for k in kwargs if k != "non_blocking"} else self
            return out.as_subclass(DeviceIndices)
        return to(self, *args, **kwargs)

    move.device_shaped = True
    return move


def device_shaped_indices(rows):
    """Makes ``rows``' table :class:`DeviceIndices` and kvshield's CUDA calls the fake's."""
    from fakes import FakeCuda

    if not getattr(torch.Tensor.to, "device_shaped", False):
        torch.Tensor.to = _to_device_shaped(torch.Tensor.to)
    try:
        from kvshield_sglang import launch_fence
    except ImportError:  # the stock world has no kvshield to fool
        launch_fence = None
    if launch_fence is not None:
        cuda = FakeCuda()
        launch_fence.torch_cuda = lambda: cuda
    rows.req_to_token = rows.req_to_token.as_subclass(DeviceIndices)


class CpuLaunch:
    """A Triton kernel as ``kernel[grid](...)`` launches it, run on the CPU by ``fn`` (no GPU here)."""

    def __init__(self, fn):
        self.fn = fn

    def __getitem__(self, grid):
        return self.fn


def _new_pages(prefix_lens, seq_lens, page_size):
    return int(((seq_lens + page_size - 1) // page_size - (prefix_lens + page_size - 1) // page_size).sum())


def _alloc_extend_on_cpu(prefix_lens, seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size):
    """``alloc_extend_kernel`` by SGLang's own CPU reference (``alloc_extend_naive``). The kernel's result is
    discarded when the free list is short (the allocator returns None), so nothing is written then."""
    from sglang.srt.mem_cache.allocator.paged import alloc_extend_naive

    if _new_pages(prefix_lens, seq_lens, page_size) <= len(free_pages):
        alloc_extend_naive(prefix_lens, seq_lens, last_loc, free_pages, out_indices, page_size, out_indices.device)


def _alloc_decode_on_cpu(seq_lens, last_loc, free_pages, out_indices, bs_upper, page_size):
    """``alloc_decode_kernel`` transcribed: a request whose next token starts a page takes the next free
    page (in batch order), the others the slot after their ``last_loc``."""
    taken = 0
    for i, seq_len in enumerate(seq_lens.tolist()):
        if (seq_len - 1) % page_size:
            out_indices[i] = last_loc[i] + 1
        elif taken < len(free_pages):
            out_indices[i] = free_pages[taken] * page_size
            taken += 1


def cpu_paged_kernels():
    """SGLang's paged allocator launches two Triton kernels; on this CPU-only machine they run as above."""
    from sglang.srt.mem_cache.allocator import paged

    paged.alloc_extend_kernel = CpuLaunch(_alloc_extend_on_cpu)
    paged.alloc_decode_kernel = CpuLaunch(_alloc_decode_on_cpu)


# SGLang's own scheduling knobs, set so that decode runs out of memory now and then (retraction): the
# running requests' reserve decays fast and is re-estimated low after a retraction.
SCHEDULING_ENV = {"SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS": "20", "SGLANG_RETRACT_DECODE_STEPS": "2"}


# A decode server's settings: retracted requests keep their KV in a host copy (SGLang's default backend).
DECODE_ARGS = {"disaggregation_mode": "decode", "disaggregation_decode_retraction_backup": "cpu_tensor"}


def publish(cfg):
    """SGLang's configuration bags for ``cfg``, as a server's launch publishes them."""
    os.environ.update(SCHEDULING_ENV)
    servers.publish_server_args(attention_backend="torch_native", page_size=cfg.page_size,
                                chunked_prefill_size=cfg.chunk, disable_radix_cache=cfg.cache == "chunk",
                                schedule_conservativeness=cfg.conservativeness,
                                max_running_requests=cfg.rows, max_prefill_tokens=cfg.max_prefill,
                                context_length=CONTEXT, **(DECODE_ARGS if cfg.disagg == "decode" else {}))
    from sglang.srt.runtime_context import get_context

    # What Scheduler.__init__ sets when the server named no micro-batch size.
    get_context().override("scheduler.pp_max_micro_batch_size_default", pp_max_micro_batch_size=cfg.rows)


def build_allocator(cfg, kv):
    """The allocator SGLang's ``KVCacheConfigurator._build_token_to_kv_pool_allocator`` builds, by the names
    that module holds (kvshield's classes once the plug-in loaded; its settings from the environment)."""
    from sglang.srt.mem_cache import kv_cache_configurator as conf

    if cfg.allocator == "kvshield":
        os.environ["KVSHIELD_LEVEL"] = cfg.level
    need_sort = cfg.disagg is not None  # as the configurator decides: prefill/decode disaggregation
    if cfg.page_size == 1:
        alloc = conf.TokenToKVPoolAllocator(cfg.size, dtype=torch.float32, device="cpu", kvcache=kv,
                                            need_sort=need_sort)
    else:
        alloc = conf.PagedTokenToKVPoolAllocator(cfg.size, page_size=cfg.page_size, dtype=torch.float32,
                                                 device="cpu", kvcache=kv, need_sort=need_sort)
    assert hasattr(alloc, "set_plan") == (cfg.allocator == "kvshield"), \
        f"{cfg.allocator} world built {type(alloc).__module__}.{type(alloc).__name__}"
    return alloc


def build_tree_cache(cfg, rows, alloc):
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams

    params = CacheInitParams(disable=False, req_to_token_pool=rows, token_to_kv_pool_allocator=alloc,
                             page_size=cfg.page_size, eviction_policy="lru")
    if cfg.cache == "chunk":
        from sglang.srt.mem_cache.chunk_cache import ChunkCache

        return ChunkCache(params)
    if cfg.cache == "radix":
        from sglang.srt.mem_cache.radix_cache import RadixCache

        return RadixCache(params)
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params.tree_components = (ComponentType.FULL,)
    return UnifiedRadixCache(params)


def build_scheduler(cfg, rows, alloc, tree, to_tokenizer):
    """SGLang's Scheduler for the memory paths of ``event_loop_normal`` (no disaggregation, no overlap, no
    speculative decoding): the attributes its ``__init__`` would set for this configuration."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch
    from sglang.srt.managers.schedule_policy import SchedulePolicy
    from sglang.srt.managers.scheduler_components.batch_result_processor import SchedulerBatchResultProcessor
    from sglang.srt.managers.scheduler_components.logprob_result_processor import SchedulerLogprobResultProcessor
    from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
    from sglang.srt.runtime_context import get_server_args

    s = servers.scheduler(page_size=cfg.page_size, max_total_num_tokens=cfg.size, max_req_len=CONTEXT)
    if cfg.disagg is not None:
        from sglang.srt.disaggregation.utils import DisaggregationMode

        s.disaggregation_mode = DisaggregationMode(cfg.disagg)
    s.model_config = types.SimpleNamespace(vocab_size=VOCAB, hf_eos_token_id=None, is_encoder_decoder=False,
                                           is_multimodal=False, think_end_ids=None)
    s.server_args = get_server_args()
    s.req_to_token_pool, s.token_to_kv_pool_allocator, s.tree_cache = rows, alloc, tree
    s.is_generation, s.enable_overlap, s.enable_overlap_mlx = True, False, False
    s.running_batch, s.last_batch, s.cur_batch_for_debug = ScheduleBatch(reqs=[], batch_is_full=False), None, None
    s.forward_ct, s.chunked_req, s._pending_chunked_abort_req = 0, None, None
    s.chunked_prefill_size, s.is_mixed_chunk, s.enable_dynamic_chunking = cfg.chunk, False, False
    s.prefill_decode_interval, s._prefill_decode_interval_remaining = 0, 0
    s.max_prefill_tokens, s.max_running_requests, s.max_prefill_bs = cfg.max_prefill, cfg.rows, 0
    s.priority_scheduling_preemption_threshold, s.truncation_align_size = 0, None
    s.enable_priority_preemption = s.enable_priority_scheduling = s.schedule_low_priority_values_first = False
    s.abort_on_priority_when_disabled = False
    s.enable_fpm = s.enable_hisparse = s.enable_hierarchical_cache = s.enable_lora = False
    s.is_hybrid_swa = s.require_mlp_sync = False
    s.hisparse_coordinator = s.prefill_delayer = s.min_free_slots_delayer = s.mm_receiver = None
    s.load_snapshot_writer = s.decode_offload_manager = s.draft_worker = None
    s.policy = SchedulePolicy("fcfs", tree, False, False, False)
    s.new_token_ratio_tracker = NewTokenRatioTracker.from_config()
    s.ps = types.SimpleNamespace(pp_size=1, dp_size=1, attn_tp_size=1, attn_tp_rank=0)
    s.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
        attn_backend=types.SimpleNamespace(), prefill_aware_swa=False))
    s.model_worker = Inert()
    s.grammar_manager = Inert(has_waiting_grammars=lambda: False, process_req_with_grammar=lambda req: False)
    s.dp_attn_adapter = Inert(maybe_prepare_mlp_sync_batch=lambda batch, need_sync=False: batch)
    s.ngram_embedding_manager = Inert(prepare_for_forward=lambda batch, chunked_req=None: batch)
    s.load_inquirer = Inert(_get_num_pending_tokens=lambda **k: 0)
    s.metrics_reporter = Inert(enable_metrics=False, num_generated_tokens=0, forward_ct_decode=0,
                               num_retracted_reqs=0)
    s.ipc_channels = Inert(send_to_tokenizer=to_tokenizer)
    s.output_streamer = Inert()  # what the client gets is read from the requests themselves
    s.return_health_check_ipcs = []
    s._prev_step = None
    s.batch_result_processor = SchedulerBatchResultProcessor(
        is_generation=True, disaggregation_mode=s.disaggregation_mode, enable_overlap=False,
        enable_overlap_mlx=False, server_args=s.server_args, model_config=s.model_config,
        token_to_kv_pool_allocator=alloc, tree_cache=tree, hisparse_coordinator=None, req_to_token_pool=rows,
        decode_offload_manager=None, metrics_collector=None, metrics_reporter=s.metrics_reporter,
        draft_worker=None, model_worker=s.model_worker,
        logprob_result_processor=SchedulerLogprobResultProcessor(model_config=s.model_config),
        output_streamer=s.output_streamer, abort_request=s.abort_request)
    return s


class World:
    """One scheduler's memory on SGLang's classes (see the module docstring)."""

    def __init__(self, cfg):
        self.cfg = cfg
        publish(cfg)
        cpu_paged_kernels()
        self.kv = MHAPool(cfg.size, cfg.page_size, layers=LAYERS, heads=1, head_dim=HEAD_DIM)
        self.rows = self.build_rows()
        device_shaped_indices(self.rows)
        self.host_rows = self.rows.req_to_token.as_subclass(torch.Tensor)  # the oracle's view: same memory
        self.offsets = buffer_offsets(len(self.kv.buffers()))
        self.alloc = build_allocator(cfg, self.kv)
        self.tree = build_tree_cache(cfg, self.rows, self.alloc)
        self.evicted = 0  # tokens SGLang's eviction took from the tree cache
        evict = self.tree.evict

        def counted_evict(params, *a, **k):
            result = evict(params, *a, **k)
            self.evicted += int(getattr(result, "num_tokens_evicted", 0) or 0)
            return result

        self.tree.evict = counted_evict
        self.chunked_steps = 0  # steps that ran a chunk of a chunked prefill
        self.abort_where = {}  # where aborted requests were: queued, mid-prefill, running
        self.to_tokenizer = ToTokenizer()
        self.sched = build_scheduler(cfg, self.rows, self.alloc, self.tree, self.to_tokenizer)
        self.tokenizers = {}
        self.tracks = []
        self.by_id = {}
        self.by_rid = {}
        self.released = []  # (track, slots its row held when last read) of requests done, in order
        self._codes = torch.zeros(1, dtype=torch.int64)
        self.oracle = Oracle(self)
        self.steps = 0
        self.reread = True  # the driver's own re-read after each step (a planted bug turns it off)

    def build_rows(self):
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool

        return ReqToTokenPool(size=self.cfg.rows, max_context_len=CONTEXT + 8, device="cpu", enable_memory_saver=False)

    # ------------------------------------------------------------ requests

    def submit(self, rid, tenant, tokens, max_new_tokens, tokenizer=0):
        """A client's request through the tokenizer process (tenant from the gateway header, sealed into the
        tokenized request when the plug-in is loaded) and the scheduler's ``handle_generate_request``.
        ``tokenizer``: which tokenizer worker takes it (each keeps its own request ids, as with several
        HTTP workers)."""
        from sglang.srt.managers.io_struct import GenerateReqInput

        tm = self.tokenizers.get(tokenizer)
        if tm is None:
            tm = self.tokenizers[tokenizer] = servers.tokenizer_manager(vocab_size=VOCAB)
        before = len(tm.sent)
        servers.send(tm, GenerateReqInput(input_ids=list(tokens), rid=rid,
                                          sampling_params={"max_new_tokens": max_new_tokens},
                                          **self.request_fields(rid)),
                     types.SimpleNamespace(headers={TENANT_HEADER: tenant}))
        (tokenized,) = tm.sent[before:]
        queued = self.queued()
        self.sched.handle_generate_request(pickle.loads(pickle.dumps(tokenized)))  # the process boundary
        (req,) = self.queued()[len(queued):]
        serial = len(self.tracks) + 1
        track = Track(req, tenant, serial, tokenizer)
        self.tracks.append(track)
        self.by_id[id(req)] = track
        self.by_rid.setdefault(rid, []).append(track)
        return track

    def request_fields(self, rid):
        """Extra fields of the client's request (none here; the decode server's carry its bootstrap)."""
        return {}

    def queued(self):
        """Where ``handle_generate_request`` puts a new request: the waiting queue."""
        return list(self.sched.waiting_queue)

    def abort_due(self, rid, when, after):
        """Whether the client of ``rid`` aborts now: ``when`` 'queued', ``after`` steps after it arrived;
        'decoding', once it has ``after`` output tokens (never for a request already done)."""
        tracks = [t for t in self.by_rid.get(rid, ()) if not self.done(t)]
        if when == "queued":
            return any(self.steps >= t.arrived + after for t in tracks)
        return any(len(t.req.output_ids) >= max(1, after) for t in tracks)

    def abort(self, rid):
        """The abort of each client whose live request is ``rid`` (its disconnect: SGLang's
        ``TokenizerManager.abort_request`` in its tokenizer worker, then the scheduler's ``abort_request``);
        counts where each aborted request was then."""
        s = self.sched
        live = [t for t in self.by_rid.get(rid, ()) if not self.done(t)]
        for t in live:
            where = ("mid-prefill" if s.chunked_req is t.req else "running" if t.req.req_pool_idx is not None
                     else "queued")
            self.abort_where[where] = self.abort_where.get(where, 0) + 1
        for tokenizer in dict.fromkeys(t.tokenizer for t in live):
            self.send_abort(tokenizer, rid=rid)

    def send_abort(self, tokenizer, **abort):
        """SGLang's ``TokenizerManager.abort_request(**abort)`` in tokenizer worker ``tokenizer``; what it sends
        reaches the scheduler's ``abort_request``."""
        tm = self.tokenizers[tokenizer]
        before = len(tm.sent)
        tm.abort_request(**abort)
        for sent in tm.sent[before:]:
            self.sched.abort_request(pickle.loads(pickle.dumps(sent)))  # the process boundary

    def serial_codes(self):
        """Tenant code of each request serial (index 0: none)."""
        if len(self._codes) != len(self.tracks) + 1:
            self._codes = torch.tensor([0] + [t.code for t in self.tracks], dtype=torch.int64)
        return self._codes

    def live(self):
        return [t for t in self.tracks if t.req.req_pool_idx is not None]

    def track_of(self, req):
        return self.by_id[id(req)]

    # ------------------------------------------------------------ one scheduler iteration

    def step(self):
        """One iteration of ``event_loop_normal`` after its requests were received: SGLang plans the batch,
        the driver's forward writes its KV, SGLang processes the result; then the oracle re-reads."""
        s = self.sched
        plan = s.get_next_batch_to_run(s.running_batch, s.last_batch)
        s.running_batch, batch = plan.running_batch, plan.batch_to_run
        self.chunked_steps += s.chunked_req is not None
        if batch is not None:
            self.oracle.fresh(batch)
            result = self.forward(batch)
            s.process_batch_result(batch, result)
        s.last_batch = batch
        self.steps += 1
        if self.reread:
            self.oracle.check_all()
        return batch

    def batch_slots(self, batch):
        """The batch's ``out_cache_loc`` with each slot's tenant code (and, in ``_spans``, its request serial,
        position and token); computed once per batch."""
        if getattr(self, "_slots_of", None) is batch.out_cache_loc:  # NOTE: the running batch is reused
            return self._slots
        slots = batch.out_cache_loc.as_subclass(torch.Tensor).to(torch.int64)
        codes, serials, positions, tokens = [], [], [], []
        if batch.forward_mode.is_decode():
            spans = [(int(s) - 1, int(s)) for s in batch.seq_lens_cpu.tolist()]
        else:
            spans = [(p, p + e) for p, e in zip(batch.prefix_lens, batch.extend_lens)]
        for req, (start, end) in zip(batch.reqs, spans):
            t = self.track_of(req)
            ids = req.origin_input_ids + req.output_ids
            codes += [t.code] * (end - start)
            serials += [t.serial] * (end - start)
            positions += range(start, end)
            tokens += ids[start:end]
        assert len(codes) == len(slots), f"{len(slots)} slots for {len(codes)} positions"
        self._spans = (torch.tensor(serials, dtype=torch.int64), torch.tensor(positions, dtype=torch.int64),
                       torch.tensor(tokens, dtype=torch.int64))
        self._slots_of, self._slots = batch.out_cache_loc, (slots, torch.tensor(codes, dtype=torch.int64))
        return self._slots

    def forward(self, batch):
        """The model's forward, as far as memory goes: every K/V buffer of every layer gets each token's
        pattern at its slot; the sampled next token is a function of the request and its length."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput
        from sglang.srt.managers.utils import GenerationBatchResult

        slots, codes = self.batch_slots(batch)
        serials, positions, tokens = self._spans
        if len(slots):
            values = pattern(codes, serials, positions, tokens)
            for b, buf in enumerate(self.kv.buffers()):
                buf[slots, 0, :] = values + self.offsets[b]
        s = self.sched
        s.forward_ct += 1
        batch.forward_iter, batch.launch_ts, batch.after_idle_gap = s.forward_ct, 0.0, False
        next_ids = [self.next_token(self.track_of(r)) for r in batch.reqs]
        return GenerationBatchResult(next_token_ids=torch.tensor(next_ids, dtype=torch.int64),
                                     logits_output=LogitsProcessorOutput(next_token_logits=None))

    def next_token(self, t):
        rng = random.Random(t.serial * 100003 + len(t.req.output_ids))
        return 1000 * t.code + rng.randrange(1000)

    # ------------------------------------------------------------ end state

    def aborted(self, t):
        """SGLang reported the request aborted (a waiting request is dropped without a finish reason)."""
        return id(t.req) in self.to_tokenizer.aborted or type(t.req.finished_reason).__name__ == "FINISH_ABORT"

    def done(self, t):
        """The client has its answer and the request holds no KV."""
        return (t.req.finished() or self.aborted(t)) and t.req.req_pool_idx is None

    def drained(self):
        return all(self.done(t) for t in self.tracks)

    def settle(self):
        """After the workload: the tree cache evicted to empty and a step boundary (kvshield makes released
        pages available only at one), so every page is either free or leaked. Returns leaked tokens."""
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        if not self.tree.is_chunk_cache():
            self.tree.evict(EvictParams(num_tokens=self.cfg.size))
        if hasattr(self.alloc, "end_step"):
            self.alloc.end_step()
        return self.cfg.size - int(self.alloc.available_size())

    def rejected_frees(self):
        return int(self.alloc.rejected_frees()) if hasattr(self.alloc, "rejected_frees") else 0

    def unattributed_pages(self):
        return int(self.alloc.unattributed_pages()) if hasattr(self.alloc, "unattributed_pages") else 0


class Workload:
    """``n`` requests of two tenants, interleaved, deterministic from ``seed``: each tenant has a few system
    prompts of its own (prefix hits stay within a tenant: the tenants' token ranges are disjoint), some
    prompts repeat an earlier one of the same tenant exactly, prompts longer than a chunk are chunked, and
    a few clients abort: some soon after arriving (the request is queued, or mid-prefill), the others once
    the request decoded a few tokens.

    ``prompt`` and ``new_tokens`` are (low, high) ranges of the unique part of a prompt and of
    ``max_new_tokens``; ``shared_prefixes`` False: no system prompts, no repeats. Every
    ``shared_rid_every``-th request (0: none) takes the rid of the request ``shared_rid_lag`` before it (just
    before: most likely still live) and the other tenant: two tokenizer workers (one per tenant here) each
    accept their own client's rid, and the scheduler sees both."""

    def __init__(self, n=150, seed=7, abort_fraction=0.08, arrivals_per_step=0.7, prompt=(2, 25), new_tokens=(4, 33),
                 shared_rid_every=0, shared_rid_lag=1, shared_prefixes=True):
        rng = random.Random(seed)
        systems = {t: [[1000 * code_of(t) + rng.randrange(1000) for _ in range(rng.randrange(4, 17))]
                       for _ in range(3)] for t in TENANTS}
        self.requests = []  # (arrival step, rid, tenant, tokens, max_new_tokens)
        self.aborts = {}  # rid -> when its client aborts: ("queued", steps after arrival) or ("decoding", tokens)
        sent = {t: [] for t in TENANTS}
        for i in range(n):
            tenant = rng.choice(TENANTS)
            rid = f"{tenant}-{i:04d}"
            shares = shared_rid_every and i % shared_rid_every == shared_rid_every - 1 and i >= shared_rid_lag
            if shares:
                prev = self.requests[-shared_rid_lag]
                tenant, rid = TENANTS[2 - code_of(prev[2])], prev[1]
            if shared_prefixes and sent[tenant] and rng.random() < 0.1:
                tokens = list(rng.choice(sent[tenant]))
            else:
                head = rng.choice(systems[tenant]) if shared_prefixes and rng.random() < 0.7 else []
                tokens = head + [1000 * code_of(tenant) + rng.randrange(1000) for _ in range(rng.randrange(*prompt))]
            sent[tenant].append(tokens)
            step = int(i / arrivals_per_step)
            self.requests.append((step, rid, tenant, tokens, rng.randrange(*new_tokens)))
            if rng.random() < abort_fraction and not shared_rid_every:
                self.aborts[rid] = (("queued", rng.randrange(0, 4)) if rng.random() < 0.3
                                    else ("decoding", rng.randrange(0, 6)))
        self.last_arrival = self.requests[-1][0] if self.requests else 0
        self._by_step = {}
        for r in self.requests:
            self._by_step.setdefault(r[0], []).append(r)

    def arrivals(self, step):
        return self._by_step.get(step, [])


class Outcome(types.SimpleNamespace):
    """What a run showed: requests finished (of ``total``), ``leaked`` tokens, ``rejected`` frees, isolation
    ``reads`` (violations) and ``residue``, ``retractions``, ``aborted``, ``steps`` (and how many the oracle
    re-read: ``checks``), tokens ``evicted`` from the tree cache, ``prefix_hits`` (SGLang's cached tokens),
    ``chunked_steps``, ``stalled``, pages allocated with no plan row (``unattributed``), messages."""

    FIELDS = ("finished", "total", "leaked", "rejected", "unattributed", "reads", "residue", "retractions", "aborted", "steps",
              "checks", "evicted", "prefix_hits", "chunked_steps", "abort_where", "stalled", "messages")

    def row(self):
        return {k: getattr(self, k) for k in self.FIELDS}


def run(world, workload, max_steps=3000, patience=60, during=None):
    """Drives ``workload`` through ``world`` until every request is done or the scheduler stops making
    progress (``patience`` steps without a batch while requests are still pending: a stall). ``during(world,
    step)`` runs after each step (attack scenarios inject there). Then settles the pool and reports."""
    idle = 0
    error = None
    pending = dict(workload.aborts)
    try:
        for step in range(max_steps):
            for _, rid, tenant, tokens, max_new in workload.arrivals(step):
                world.submit(rid, tenant, tokens, max_new, tokenizer=tenant).arrived = step
            for rid in [r for r in pending if world.abort_due(r, *pending[r])]:
                world.abort(rid)
                del pending[rid]
            batch = world.step()
            if during is not None:
                during(world, step)
            if step >= workload.last_arrival and world.drained():
                break
            idle = 0 if batch is not None else idle + 1
            if step >= workload.last_arrival and idle >= patience:
                break
    except RuntimeError as e:  # SGLang's own out-of-memory errors (allocation.py) stop the scheduler
        error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
    done = [t for t in world.tracks if world.done(t)]
    stalled = len(done) < len(world.tracks)
    evicted = world.evicted  # before settle() empties the tree
    leaked = world.settle()
    messages = list(world.oracle.messages)
    if error:
        messages.insert(0, f"scheduler raised at step {world.steps}: {error}")
    elif stalled:
        pending = [t.req.rid for t in world.tracks if t not in done][:5]
        messages.insert(0, f"stalled after {world.steps} steps: {len(world.tracks) - len(done)} requests pending "
                           f"(e.g. {pending}); waiting {len(world.sched.waiting_queue)}, running "
                           f"{len(world.sched.running_batch.reqs)}, available {world.alloc.available_size()} tokens")
    return Outcome(finished=len(done), total=len(world.tracks), leaked=leaked, rejected=world.rejected_frees(),
                   unattributed=world.unattributed_pages(),
                   reads=world.oracle.reads, residue=world.oracle.residue,
                   retractions=sum(t.req.retraction_count for t in world.tracks),
                   aborted=sum(1 for t in done if world.aborted(t)),
                   steps=world.steps, checks=world.oracle.checks, stalled=stalled or error is not None,
                   evicted=evicted, prefix_hits=sum(t.req.cached_tokens for t in world.tracks),
                   chunked_steps=world.chunked_steps, abort_where=dict(world.abort_where), messages=messages)


# ---------------------------------------------------------------- attacks, injected where SGLang's stale paths are

def as_device_indices(slots):
    return torch.as_tensor(slots, dtype=torch.int64).clone().as_subclass(DeviceIndices)


class StaleFree:
    """A stale free of a finished request's slots, once a live request of the other tenant (or, with
    ``victim='same'``, of the same tenant) holds one of them: ``mode`` 'free' calls ``allocator.free`` (as a
    stale radix-cache eviction, duplicate-prefix or chunk-cache free would), 'segment' calls
    ``free_segment(slots, start_pos=0)`` (as a stale over-allocation release would), 'release' frees them
    inside the next release SGLang runs for a request of the finished request's tenant (SGLang's
    ``cache_finished_req``, under the plug-in's release context). Up to ``times`` injections;
    ``self.hits`` names each (finished request, victim, slots shared)."""

    def __init__(self, mode, victim="other", times=3):
        self.mode, self.victim, self.times = mode, victim, times
        self.hits = []
        self._armed = None

    def __call__(self, world, step):
        if len(self.hits) >= self.times or self._armed is not None:
            return
        live = [t for t in world.live() if len(t.slots)]
        for old, slots in reversed(world.released[-40:]):
            for v in live:
                if (v.tenant != old.tenant) == (self.victim == "other") and v is not old:
                    shared = sorted(set(slots.tolist()) & set(v.slots.tolist()))
                    if shared:
                        self.hits.append((old.req.rid, v.req.rid, len(shared)))
                        world.released.remove((old, slots))
                        self._inject(world, old, slots)
                        return

    def _inject(self, world, old, slots):
        a = world.alloc
        if self.mode == "free":
            a.free(as_device_indices(slots))
        elif self.mode == "segment":
            a.free_segment(as_device_indices(slots), start_pos=0)
        else:
            self._armed = (old.tenant, slots)
            self._wrap_release(world)

    def _wrap_release(self, world):
        tree = world.tree
        if "cache_finished_req" in vars(tree):
            return
        original = tree.cache_finished_req

        def cache_finished_req(req, *a, **k):
            armed = self._armed
            if armed is not None and world.track_of(req).tenant == armed[0]:
                self._armed = None
                world.alloc.free(as_device_indices(armed[1]))
            return original(req, *a, **k)

        tree.cache_finished_req = cache_finished_req


class AbortMidPrefill:
    """Aborts (SGLang's ``abort_request``, as a client disconnect does) the request being chunk-prefilled once
    at least one of its chunks ran, for up to ``times`` requests: SGLang releases it through
    ``process_pending_chunked_abort`` at the next step."""

    def __init__(self, times=6):
        self.times = times
        self.hits = []

    def __call__(self, world, step):
        req = world.sched.chunked_req
        if req is None or len(self.hits) >= self.times or req.rid in self.hits or not len(req.prefix_indices):
            return
        self.hits.append(req.rid)
        world.abort(req.rid)


class SharedRidWatch:
    """Counts the steps at which two live requests of different tenants carried the same rid."""

    def __init__(self):
        self.steps = 0

    def __call__(self, world, step):
        tenants = {}
        for t in world.live():
            tenants.setdefault(t.req.rid, set()).add(t.tenant)
        if any(len(ts) > 1 for ts in tenants.values()):
            self.steps += 1


def chain(*hooks):
    def during(world, step):
        for h in hooks:
            h(world, step)

    return during


# ---------------------------------------------------------------- verdicts

def verdict(o, *, residue_free=True, injected_frees=False, min_retractions=0, exercised=()):
    """The scenario's oracle on a run's :class:`Outcome`; raises AssertionError naming every failure:
    a stall (or a scheduler crash), a leak, an isolation violation, residue (when the allocator promises
    fresh pages: ``residue_free``), a rejected free nobody injected (or none where frees were injected),
    a page allocated with no plan row (its holder could not refuse a stale free of it), a step the oracle
    did not re-read, fewer retractions than the scenario is about, a path the scenario is
    about (``exercised``: 'eviction', 'prefix hits', 'chunked prefill') that it never took."""
    problems = []
    if o.stalled:
        problems.append(f"stall: {o.finished} of {o.total} requests finished")
    if o.leaked:
        problems.append(f"leak: available differs from the pool's total by {o.leaked} tokens")
    if o.reads:
        problems.append(f"isolation: {o.reads} positions of live requests read bytes not their own")
    if residue_free and o.residue:
        problems.append(f"residue: {o.residue} freshly allocated slots showed another tenant's bytes")
    if injected_frees and not o.rejected:
        problems.append("rejected frees: none of the injected stale frees was rejected")
    if not injected_frees and o.rejected:
        problems.append(f"rejected frees: {o.rejected} pages of frees nobody injected were rejected")
    if o.unattributed:
        problems.append(f"unattributed: {o.unattributed} pages were allocated with no plan row")
    if o.checks != o.steps:
        problems.append(f"re-read: the oracle re-read after {o.checks} of {o.steps} steps")
    if o.retractions < min_retractions:
        problems.append(f"retraction: only {o.retractions} retractions (the scenario needs {min_retractions})")
    for path, count in (("eviction", o.evicted), ("prefix hits", o.prefix_hits), ("chunked prefill", o.chunked_steps)):
        if path in exercised and not count:
            problems.append(f"{path}: the run never took this path")
    assert not problems, "; ".join(problems) + (" | " + " | ".join(o.messages[:4]) if o.messages else "")


# ---------------------------------------------------------------- planted bugs (test code only)

class Swapped:
    """Replaces ``module.name`` with ``value`` for the length of a ``with`` block."""

    def __init__(self, module, name, value):
        self.module, self.name, self.value = module, name, value

    def __enter__(self):
        self.saved = getattr(self.module, self.name)
        setattr(self.module, self.name, self.value)

    def __exit__(self, *exc):
        setattr(self.module, self.name, self.saved)


def forgets_kv(req, tree_cache, is_insert=True):
    """Planted bug: a release that gives the request's row back but never frees its KV (nor unlocks it)."""
    tree_cache.req_to_token_pool.free(req)
    req.kv = None


def drops_one_free(world, after_step=40):
    """Planted bug: the allocator silently drops the first free after ``after_step``."""
    alloc, original = world.alloc, world.alloc.free

    def free(free_index):
        if world.steps >= after_step and not world.planted_dropped and free_index.numel():
            world.planted_dropped = True
            return None
        return original(free_index)

    world.planted_dropped = False
    alloc.free = free


def skips_one_plan(world, at_step=40):
    """Planted bug: the planning hook misses one step's plan (its allocation has no plan row)."""
    alloc, original = world.alloc, world.alloc.set_plan

    def set_plan(rows):
        if world.steps >= at_step and not world.planted_skipped:
            world.planted_skipped = True
            return None
        return original(rows)

    world.planted_skipped = False
    alloc.set_plan = set_plan


def hides_memory(world, after_step=30):
    """Planted bug: from ``after_step`` on, the allocator reports a nearly empty pool."""
    alloc, original = world.alloc, world.alloc.available_size

    def available_size():
        real = original()
        return real if world.steps < after_step else min(real, world.cfg.page_size)

    alloc.available_size = available_size


class DropsLastPage:
    """Planted bug: a transport that reports the transfer done (metadata copied, Success) but never writes the
    request's last KV page into decode memory."""

    def __new__(cls, *args):
        import wire

        class Route(wire.Route):
            def carry(self, sender, page_ids):
                page_ids = list(page_ids)
                last = page_ids[-1] if self.sent + len(page_ids) >= sender.num_pages else None
                dst = self.dst_kv
                if last is not None:
                    keep = [b.clone() for b in dst.buffers()]
                super().carry(sender, page_ids)
                if last is not None:
                    page = int(self.receiver.kv_indices[sender.num_pages - 1]) * self.page_size
                    for b, k in zip(dst.buffers(), keep):
                        b[page:page + self.page_size] = k[page:page + self.page_size]

        return Route(*args)


# ---------------------------------------------------------------- the scenario catalogue

CONFIGS = [(cache, page) for cache in ("unified", "radix", "chunk") for page in (1, 4)]
STALE_FREE = {"free": [("unified", 4), ("chunk", 1)], "segment": [("radix", 4), ("chunk", 4)],
              "release": [("unified", 1), ("radix", 1)]}


def _main_run(side, cache, page, level="ZERO", reread=True, plant=None):
    w = World(Config(side, cache, page, level=level))
    w.reread = reread
    if plant is not None:
        plant(w)
    return run(w, Workload())


def _plain_run():
    """Planted bug (of the workload): short unique prompts in a roomy pool never chunk, hit or evict."""
    return run(World(Config("stock", "radix", 4, size=480)), Workload(n=20, prompt=(2, 10), shared_prefixes=False))


def _stale_free_run(side, cache, page, mode):
    w = World(Config(side, cache, page))
    attack = StaleFree(mode)
    o = run(w, Workload(n=60), during=attack)
    assert attack.hits, f"no finished request's slots were reused by a live request of the other tenant"
    o.messages.insert(0, f"injected: {attack.hits}")
    return o


def _same_rid_run(side, cache, page, lag=1):
    w = World(Config(side, cache, page))
    watch = SharedRidWatch()
    o = run(w, Workload(n=60, shared_rid_every=5, shared_rid_lag=lag), during=watch)
    o.shared_rid_steps = watch.steps
    return o


def _mid_prefill_run(side, cache, page):
    w = World(Config(side, cache, page))
    attack = AbortMidPrefill()
    o = run(w, Workload(n=40, prompt=(30, 90), new_tokens=(2, 8)), during=attack)
    o.mid_prefill_aborts = sum(1 for t in w.tracks if t.req.rid in attack.hits and w.aborted(t))
    return o


def _retraction_run(side, cache, page):
    w = World(Config(side, cache, page, size=96, rows=8))
    return run(w, Workload(n=30, prompt=(2, 12), new_tokens=(16, 48), abort_fraction=0))


def _pd_run(side, page, size=400, route=None):
    """The decode server: ``size`` 400 holds every request (no retraction), 96 forces decode retractions
    (SGLang's host copy of the retracted KV, loaded back at resume)."""
    import servers

    with servers.single_rank():
        w = PdWorld(Config(side, "chunk", page, size=size, rows=8, disagg="decode"), route=route)
        return run(w, Workload(n=40, prompt=(2, 20), new_tokens=(2, 12), abort_fraction=0.15))


def _check_same_rid(o, residue_free=True):
    verdict(o, residue_free=residue_free)
    assert o.shared_rid_steps > 0, "same rid: no two live requests of different tenants ever shared a rid"


def _check_mid_prefill(o, residue_free=True):
    verdict(o, residue_free=residue_free)
    assert o.mid_prefill_aborts > 0, "mid-prefill: no request was aborted between its chunks"


def scenarios_for(side):
    """``{name: (run, check)}``: ``run()`` returns an :class:`Outcome`, ``check(outcome)`` is its oracle.
    Stock SGLang (no plug-in) shows no residue guarantee; everything else is the same oracle."""
    fresh = side == "kvshield"
    out = {}
    for cache, page in CONFIGS:
        paths = ("chunked prefill",) if cache == "chunk" else ("chunked prefill", "eviction", "prefix hits")
        out[f"main-{cache}-p{page}"] = (lambda c=cache, p=page: _main_run(side, c, p),
                                       lambda o, paths=paths: verdict(o, residue_free=fresh, exercised=paths))
    for mode, configs in STALE_FREE.items():
        for cache, page in configs:
            out[f"stale-{mode}-{cache}-p{page}"] = (lambda c=cache, p=page, m=mode: _stale_free_run(side, c, p, m),
                                                   lambda o: verdict(o, residue_free=fresh, injected_frees=True))
    for cache, page in (("unified", 4), ("chunk", 1)):
        out[f"same-rid-{cache}-p{page}"] = (lambda c=cache, p=page: _same_rid_run(side, c, p),
                                            lambda o: _check_same_rid(o, fresh))
    for cache, page in (("radix", 4), ("chunk", 1)):
        out[f"abort-mid-prefill-{cache}-p{page}"] = (lambda c=cache, p=page: _mid_prefill_run(side, c, p),
                                                    lambda o: _check_mid_prefill(o, fresh))
    for cache, page in (("unified", 1), ("chunk", 4)):
        out[f"retraction-{cache}-p{page}"] = (lambda c=cache, p=page: _retraction_run(side, c, p),
                                             lambda o: verdict(o, residue_free=fresh, min_retractions=3))
    for page in (1, 4):
        out[f"pd-decode-chunk-p{page}"] = (lambda p=page: _pd_run(side, p),
                                          lambda o: verdict(o, residue_free=fresh))
    out["pd-retraction-chunk-p4"] = (lambda: _pd_run(side, 4, size=96),
                                     lambda o: verdict(o, residue_free=fresh, min_retractions=3))
    if side == "kvshield":
        out["twin-level-none-residue"] = (lambda: _main_run(side, "radix", 4, level="NONE"), verdict)
        out["twin-skips-one-plan"] = (lambda: _main_run(side, "unified", 1, plant=skips_one_plan), verdict)
    else:
        out["twin-workload-takes-no-path"] = (_plain_run, lambda o: verdict(
            o, residue_free=False, exercised=("chunked prefill", "eviction", "prefix hits")))
        out["twin-skip-reread"] = (lambda: _main_run(side, "unified", 1, reread=False),
                                   lambda o: verdict(o, residue_free=False))
        out["twin-drops-a-free"] = (lambda: _main_run(side, "chunk", 4, plant=drops_one_free),
                                    lambda o: verdict(o, residue_free=False))
        out["twin-hides-memory"] = (lambda: _main_run(side, "radix", 1, plant=hides_memory),
                                    lambda o: verdict(o, residue_free=False))
        out["twin-same-rid-never-concurrent"] = (lambda: _same_rid_run(side, "unified", 4, lag=40),
                                                 lambda o: _check_same_rid(o, False))

        def unreleased_chunk():
            from sglang.srt.managers import scheduler

            with Swapped(scheduler, "release_kv_cache", forgets_kv):
                return _mid_prefill_run(side, "chunk", 1)

        def unreleased_retraction():
            from sglang.srt.managers import schedule_batch

            with Swapped(schedule_batch, "release_kv_cache", forgets_kv):
                return _retraction_run(side, "chunk", 4)

        out["twin-pd-transport-drops-last-page"] = (lambda: _pd_run(side, 4, route=DropsLastPage),
                                                    lambda o: verdict(o, residue_free=False))
        out["twin-abort-mid-prefill-unreleased"] = (unreleased_chunk, lambda o: _check_mid_prefill(o, False))
        out["twin-retraction-unreleased"] = (unreleased_retraction, lambda o: verdict(o, residue_free=False,
                                                                                      min_retractions=3))
    return out


def report(side, names=None):
    """Runs ``side``'s scenarios (or those in ``names``) and prints one ``RESULTS <json>`` line:
    ``{name: [pass|fail|error, message], "__metrics__": {name: outcome row}}``."""
    import json
    import traceback

    results, metrics = {}, {}
    for name, (go, check) in scenarios_for(side).items():
        if names and name not in names:
            continue
        try:
            o = go()
            metrics[name] = o.row()
            check(o)
            results[name] = ["pass", ""]
        except AssertionError as e:
            results[name] = ["fail", f"AssertionError: {e}"]
        except Exception as e:  # noqa: BLE001 (reported to the test, which names the scenario)
            results[name] = ["error", "".join(traceback.format_exception(e))[-2000:]]
    results["__metrics__"] = metrics
    print("RESULTS " + json.dumps(results))


def main():
    """``SCHEDULER_WORLD_SIDE``: 'stock' (SGLang as shipped) or 'kvshield' (the plug-in loaded first, as in a
    server); ``SCHEDULER_WORLD_ONLY``: comma-separated scenario names (default: all of the side's)."""
    import servers
    import wire

    side = os.environ.get("SCHEDULER_WORLD_SIDE", "kvshield")
    if side == "kvshield":
        from kvshield_sglang import plugin

        plugin.load()
    wire.install()  # the decode server's transport (a test one in SGLang's registry)
    servers.one_process_group()  # the disaggregation queues agree on polls over a gloo group
    only = [n for n in os.environ.get("SCHEDULER_WORLD_ONLY", "").split(",") if n]
    report(side, only)


# ---------------------------------------------------------------- the decode server of a prefill/decode split

class PdWorld(World):
    """The decode server of a prefill/decode split on SGLang's own decode path: requests arrive through
    ``handle_generate_request`` into its ``DecodePreallocQueue``; each iteration of
    ``event_loop_normal_disagg_decode`` runs ``process_decode_queue`` (preallocation: pages reserved and
    their ids sent to the prefill side through the receiver's ``send_metadata``; the transfer queue's
    ``pop_transferred`` commits what landed) and ``get_next_disagg_decode_batch_to_run`` (the prebuilt batch
    of committed requests, then decode batches through ``update_running_batch``), the driver's forward and
    ``process_batch_result``. ``DecodeReqToTokenPool``, ``ChunkCache``, ``MetadataBuffers``; the allocator
    built with ``need_sort`` as the configurator does in disaggregation mode.

    The prefill server is the driver's: once a request's receiver got its page ids, it sends the request's
    prompt KV (the same pattern the oracle expects: tenant, request, position, token) and its first output
    token over a transport that writes decode memory itself and then copies the metadata rows (a Mooncake
    receiver in SGLang's class hierarchy, :mod:`wire`), as a prefill server with kvshield does (its sender
    armed to publish coverage when the plug-in is loaded)."""

    ROOMS = itertools.count(5000)

    def __init__(self, cfg, route=None):
        assert cfg.cache == "chunk" and cfg.disagg == "decode", "the decode server runs ChunkCache (no decode radix)"
        super().__init__(cfg)
        import wire
        from sglang.srt.disaggregation import decode as dmod
        from sglang.srt.disaggregation.utils import MetadataBuffers, ReqToMetadataIdxAllocator

        s = self.sched
        s.enable_decode_hicache = s.enable_hicache_storage = s.enable_staging = False
        s.future_map = Inert()
        s.tp_worker.is_hybrid_swa = False
        s.tp_worker.model_runner.kv_cache_dtype_str = "float32"
        s.tp_worker.model_runner.effective_max_total_num_tokens = cfg.size
        s.model_config.num_hidden_layers, s.model_config.get_total_num_kv_heads = LAYERS, lambda: 1
        s.attn_cp_cpu_group = s.attn_tp_cpu_group = None
        s.ps.dp_rank = s.ps.tp_rank = s.ps.pp_rank = s.ps.gpu_id = 0
        s.sliding_window_size = None
        self.meta_rows = cfg.rows * 2
        self.dmeta = MetadataBuffers(self.meta_rows, 4, torch.float32)
        self.pmeta = MetadataBuffers(self.meta_rows, 4, torch.float32)
        self.pmeta_rows = ReqToMetadataIdxAllocator(self.meta_rows)
        dmeta_rows = ReqToMetadataIdxAllocator(self.meta_rows)
        s.disagg_decode_transfer_queue = dmod.DecodeTransferQueue(None, dmeta_rows, 0, self.dmeta, s, self.tree)
        s.disagg_decode_prealloc_queue = dmod.DecodePreallocQueue(
            self.rows, self.alloc, None, dmeta_rows, self.dmeta, s, s.disagg_decode_transfer_queue, self.tree, None,
            0, 1, 1, 0, 8998, cfg.size, 0, 0, wire.METADATA)
        # The prefill server's KV memory (the source of the transfers) and what it has sent.
        self.pkv = MHAPool(CONTEXT, cfg.page_size, layers=LAYERS, heads=1, head_dim=HEAD_DIM)
        self.sent = set()
        self.rooms = {}
        self.route = route or wire.Route

    def build_rows(self):
        from sglang.srt.disaggregation.decode import DecodeReqToTokenPool

        return DecodeReqToTokenPool(self.cfg.rows, CONTEXT + 8, "cpu", False, self.cfg.rows)

    def request_fields(self, rid):
        room = self.rooms[rid] = next(self.ROOMS)
        return {"bootstrap_host": "10.0.0.1", "bootstrap_port": 8998, "bootstrap_room": room}

    def queued(self):
        return [d.req for d in self.sched.disagg_decode_prealloc_queue.queue]

    def step(self):
        """One iteration of ``event_loop_normal_disagg_decode``, then the prefill side's sends."""
        s = self.sched
        s.process_decode_queue()
        plan = s.get_next_disagg_decode_batch_to_run(running_batch=s.running_batch)
        s.running_batch, batch = plan.running_batch, plan.batch_to_run
        if batch is not None:
            self.oracle.fresh(batch)
            s.process_batch_result(batch, self.forward(batch))
        s.last_batch = batch
        self.steps += 1
        self.prefill_sends()
        if self.reread:
            self.oracle.check_all()
        return batch

    def prefill_sends(self):
        """The prefill server sends every request whose receiver knows its decode pages: the prompt's KV into
        the prefill pool's pages (token i of request r: the pattern of r at position i), the first output token
        into its metadata row, then all pages in one ``send`` (the transport carries them)."""
        import wire
        from sglang.srt.disaggregation.fake.conn import FakeKVManager
        from sglang.srt.disaggregation.base.conn import KVArgs
        from sglang.srt.disaggregation.utils import DisaggregationMode

        for d in self.sched.disagg_decode_transfer_queue.queue:
            receiver, req = d.kv_receiver, d.req
            if id(req) in self.sent or getattr(receiver, "kv_indices", None) is None:
                continue
            self.sent.add(id(req))
            t, n, page = self.track_of(req), len(req.origin_input_ids), self.cfg.page_size
            pages = -(-n // page)
            slots = torch.arange(page, page + n)  # the prefill pool's pages 1.. (one transfer at a time)
            values = pattern(torch.full((n,), t.code), torch.full((n,), t.serial), torch.arange(n), t.tokens(n))
            for b, buf in enumerate(self.pkv.buffers()):
                buf[page: page * (pages + 1)] = 0  # a protected prefill server's pages hold nothing else
                buf[slots, 0, :] = values + self.offsets[b]
            first = servers.request(req.rid, list(req.origin_input_ids), t.tenant, bootstrap_host="10.0.0.1",
                                    bootstrap_port=8998, bootstrap_room=req.bootstrap_room)
            first.output_ids.append(self.next_token(t))
            first.metadata_buffer_index = self.pmeta_rows.alloc()
            self.pmeta.set_buf(first)
            args = KVArgs()
            args.page_size = page
            sender = wire.WireKVSender(FakeKVManager(args, DisaggregationMode.PREFILL, None), "10.0.0.2:8998",
                                       req.bootstrap_room, [0], 0)
            if hasattr(self.alloc, "set_plan"):  # the prefill server runs kvshield too: its sender publishes coverage
                from kvshield_sglang import transport
                from kvshield_sglang.disagg import _tenant_of

                transport.arm_sender(sender, first, self.pmeta, page, self.alloc.admission_limits()[0],
                                     tenant=_tenant_of(first), carried=len(self.pkv.buffers()))
            sender.init(pages, first.metadata_buffer_index)
            wire.ROUTES[req.bootstrap_room] = self.route(self.pkv, self.kv, receiver, self.pmeta, self.dmeta, page)
            sender.send(list(range(1, pages + 1)))
            del wire.ROUTES[req.bootstrap_room]
            self.pmeta_rows.free(first.metadata_buffer_index)
