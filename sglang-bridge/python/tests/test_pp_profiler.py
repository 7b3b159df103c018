"""SGLang's PP dynamic-chunking profiler (``--enable-dynamic-chunking`` with ``pp_size > 1``:
``SchedulerPPMixin.profile_and_init_predictor`` runs sample forwards at start-up) under kvshield: it leaves the pool
as it found it, and a free inside it is its sample request's release, so another holder's pages are refused. Each
runs in a subprocess on the real SGLang (:mod:`server_scenarios`); the twin drops the profiler hook and must leak."""

from server_scenarios import run_scenario, scheduler_scenario


# --------------------------------------------------------------------------------------------------------------
# Pipeline parallelism's dynamic-chunking profiler leaks the pool (its frees are refused).
# --------------------------------------------------------------------------------------------------------------

PP_PROFILER = scheduler_scenario(r"""
import types
import scheduler_world
from sglang.srt.managers import scheduler_pp_mixin
scheduler_world.cpu_paged_kernels()  # SGLang's paged allocator's two Triton kernels, as CPU code
servers.publish_server_args(attention_backend="torch_native", page_size=4)
a, kv = allocator(4, size=256)
cache = servers.radix_cache(a)
s = servers.scheduler(page_size=4, max_total_num_tokens=256)
s.req_to_token_pool, s.token_to_kv_pool_allocator, s.tree_cache = cache.req_to_token_pool, a, cache
s.pp_group = types.SimpleNamespace(is_first_rank=True)
s.model_config = types.SimpleNamespace(vocab_size=100, is_encoder_decoder=False, hidden_size=4, dtype=torch.float32,
                                       context_len=128)
# only the model and the GPU are replaced: no forward, no device sync, no progress bar (a compat stub here)
s.tp_worker = types.SimpleNamespace(model_runner=types.SimpleNamespace(
    model_config=s.model_config, get_pp_proxy_topk_size=lambda: None, forward=lambda **k: None))
scheduler_pp_mixin.ForwardBatch = types.SimpleNamespace(init_new=lambda batch, runner, **k: None)
scheduler_pp_mixin.get_device_module = lambda: types.SimpleNamespace(synchronize=lambda: None)
scheduler_pp_mixin.tqdm = lambda it, **k: it
s.device, s.chunked_prefill_size = "cpu", 16
s.ps = types.SimpleNamespace(attn_tp_size=1, attn_cp_size=1, pp_rank=0)
if os.environ.get("FOREIGN"):  # another tenant's request holds KV; a free inside the profiler names its slots
    other = servers.request("g1", list(range(100, 108)), "globex")
    with servers.single_rank():
        foreign = servers.prefill(cache, [other]).out_cache_loc.clone()
    write(kv, foreign, 7.0)
    a.end_step()
    frees = [foreign]
    def forward(**k):
        while frees:
            a.free(frees.pop())
    s.tp_worker.model_runner.forward = forward
OUT["available_before"] = a.available_size()
try:
    with servers.single_rank():
        s.profile_and_init_predictor()  # Scheduler.__init__ runs it with --enable-dynamic-chunking and pp_size > 1
    OUT["profiler"] = "ok"
except Exception as e:  # Scheduler.__init__ catches it, logs a warning and disables dynamic chunking
    OUT["profiler"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
a.end_step()
OUT["available_after"] = a.available_size()
OUT["rejected"] = a.rejected_frees()
if os.environ.get("FOREIGN"):
    OUT["globex"] = [a.page_owner(int(p) // 4)[0] for p in foreign[::4]], kv.read(foreign)[0, :, 0, 0].tolist()
""")


def test_the_pp_dynamic_chunking_profiler_leaves_the_pool_as_it_found_it(jvm, tmp_path):
    """Drop-in contract (README: behaves like SGLang's class where upstream succeeds; availability exact). With
    ``--enable-dynamic-chunking`` and ``pp_size > 1``, ``Scheduler.__init__`` runs
    ``SchedulerPPMixin.profile_and_init_predictor`` before serving: for each sample it builds a ``Req``, runs
    ``ScheduleBatch.prepare_for_extend`` (kvshield's planning hook attributes the pages to that Req) and then
    releases the KV itself with ``token_to_kv_pool_allocator.free(req_to_token[row, :end])`` -- outside any
    hooked release. kvshield refuses each of those frees (counted: "none of them this holder's"), the pages stay
    held by Reqs that no longer exist, and the profiler's later samples fail with "Prefill out of memory"
    (caught by ``Scheduler.__init__``: dynamic chunking silently disabled). With SGLang's own allocator the same
    run profiles every sample and leaves all 256 tokens available; with kvshield the server starts with 16."""
    out = run_scenario(tmp_path, PP_PROFILER, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["available_before"] == 256, out
    assert out["profiler"] == "ok", f"the profiler failed: {out}"
    assert out["available_after"] == 256 and out["rejected"] == 0, f"the profiler's KV leaked: {out}"


def test_twin_without_the_profiler_hook_the_profiler_leaks_the_pool(jvm, tmp_path):
    plant = "plugin.HOOKS = tuple(h for h in plugin.HOOKS if h[0] != 'pp-profiler')  # planted bug: no hook\n"
    out = run_scenario(tmp_path, PP_PROFILER, plant=plant, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["profiler"] != "ok" and out["available_after"] < 256 and out["rejected"] > 0, out


def test_a_free_inside_the_profiler_of_another_holders_pages_is_refused(jvm, tmp_path):
    """Inside the profiler a free is its sample request's release: a slot it does not hold (here another tenant's
    request's, freed from inside the profiled forward) is refused, and that tenant's KV stays its own, byte for
    byte; the profiler still leaves the pool as it found it."""
    out = run_scenario(tmp_path, PP_PROFILER, FOREIGN="1", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["profiler"] == "ok" and out["available_after"] == out["available_before"] == 248, out
    assert out["rejected"] == 2, out  # globex's two pages
    assert out["globex"] == [["globex", "globex"], [7.0] * 8], out
