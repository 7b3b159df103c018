"""Speculative decoding on SGLang's real code paths, two tenants, KV bytes read back: EAGLE's draft pool and the
prefix caches it shares pages through. Each scenario writes recognisable values per tenant (and, in the draft pool,
per token), drives SGLang's own functions (``Req``, ``PrefillAdder`` + ``prepare_for_extend``, the tree cache's
match and ``release_kv_cache``) and asserts on what a request reads; each has a planted-bug twin that must fail."""

import pytest

from server_scenarios import run_scenario, scheduler_scenario

# --------------------------------------------------------------------------------------------------------------
# EAGLE's draft KV at token position i is computed from token i + 1 (the draft model's input is shifted by one:
# SGLang's own trees key EAGLE's pages by bigrams, ``CacheInitParams.is_eagle``). The scheduler passes every tree a
# plain ``RadixKey`` (``Req.init_next_round_input``); the stock trees turn it into a bigram view themselves.
# --------------------------------------------------------------------------------------------------------------

EAGLE_PREFIX = scheduler_scenario(r"""
import torch
from kvshield_sglang import prefix_cache
from sglang.srt.mem_cache.cache_init_params import CacheInitParams
from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
if os.environ.get("PLANTED") == "plain-keys-match":  # planted bug: the backend ignores is_eagle (as before the fix)
    prefix_cache._bigram_keys = lambda params: False
servers.publish_server_args(attention_backend="torch_native", page_size=4, speculative_algorithm="EAGLE",
                            speculative_num_steps=3, speculative_eagle_topk=1, speculative_num_draft_tokens=4)
a, kv = allocator(4)
draft = MHAPool(64, 4)                      # the EAGLE draft worker's KV pool on the same slots
a.kvshield_register_kvcache(draft)
rows = ReqToTokenPool(size=16, max_context_len=128, device="cpu", enable_memory_saver=False)
cache = prefix_cache.KvShieldPrefixCache(CacheInitParams(disable=False, req_to_token_pool=rows,
                                                         token_to_kv_pool_allocator=a, page_size=4, is_eagle=True),
                                         shared_tenant="public")
TOKENS = list(range(1, 13))                 # 3 full pages
def run(req, code):
    # prefill, then the forward: the target's KV names the tenant; the draft's at position i is computed from
    # token i + 1 (the last one from the token the step samples, 99 here)
    with servers.single_rank():
        batch = servers.prefill(cache, [req])
    seq = list(req.origin_input_ids) + [99]
    loc = batch.out_cache_loc
    pos = torch.arange(len(req.prefix_indices), len(req.prefix_indices) + len(loc))
    write(kv, loc, code)
    for b in draft.buffers():
        b[loc] = torch.tensor([float(seq[p + 1]) for p in pos.tolist()]).view(-1, 1, 1)
    return batch
# the operator's shared tenant's request: its pages are cached in the shared namespace
pub = servers.request("pub", TOKENS, "public", max_new_tokens=1)
run(pub, 3.0)
pub.kv_committed_len = 12
pub.output_ids.append(99)
pub.finished_reason, pub.finished_len = FINISH_LENGTH(length=1), 1
common.release_kv_cache(pub, cache)
a.end_step()
OUT["cached"] = cache.evictable_size()      # pages kept for matches (counted toward the tenant's quota meanwhile)
# acme's request shares the first two pages' tokens, then goes on with its own (its token 8 is 50, not 9)
mine = servers.request("mine", TOKENS[:8] + [50, 51, 52, 53], "acme", max_new_tokens=1)
run(mine, 1.0)
matched = mine.prefix_indices.to(torch.int64)
own = list(mine.origin_input_ids)
got = draft.read(matched)[0, :, 0, 0].tolist()
OUT["matched"] = len(matched)
# every matched position's draft KV must be what the draft computes for acme's own next token
OUT["foreign"] = [[p, got[p], own[p + 1]] for p in range(len(got)) if got[p] != own[p + 1]]
OUT["rejected"] = a.rejected_frees()
""")


def test_an_eagle_request_never_reads_draft_kv_computed_from_a_token_it_does_not_have(jvm, tmp_path):
    """README ("The ``kvshield`` radix-cache backend ...; an EAGLE bigram key matches nothing"): under EAGLE the
    backend must not hand out whole pages matched on plain keys, as their last position's draft KV was computed
    from the next token of whoever wrote them. Here the shared tenant ``public`` cached 3 pages; acme's request has
    the same first 8 tokens, then 50 where ``public`` had 9. Before the fix the backend matched 8 tokens (SGLang
    passes plain keys, flagging EAGLE on ``CacheInitParams.is_eagle``, which the backend ignored; its bigram guard
    never fired): acme's draft read, at position 7, draft KV computed from ``public``'s token 9, a token acme never
    sent (SGLang's own bigram tree matches 4 there). The backend caches nothing under EAGLE either: pages no match
    reaches would only count toward their tenant's quota until evicted."""
    out = run_scenario(tmp_path, EAGLE_PREFIX, KVSHIELD_SHARED_PREFIX_TENANT="public")
    assert out["cached"] == 0, f"the backend keeps {out['cached']} tokens of EAGLE pages no match can reach"
    assert out["foreign"] == [] and out["rejected"] == 0, (
        f"acme's EAGLE request matched {out['matched']} tokens; [position, draft KV's token, acme's token]: "
        f"{out['foreign']}")


def test_twin_an_eagle_match_on_plain_keys_reads_the_shared_tenants_next_token(jvm, tmp_path):
    out = run_scenario(tmp_path, EAGLE_PREFIX, KVSHIELD_SHARED_PREFIX_TENANT="public", PLANTED="plain-keys-match")
    assert out["cached"] == 12 and out["matched"] == 8 and out["foreign"] == [[7, 9.0, 50]], out


# --------------------------------------------------------------------------------------------------------------
# NGRAM speculative decoding drafts from one n-gram corpus per scheduler: every request's token tails (prompt and
# output) go in after each verify (``NGRAMWorker._update_ngram_corpus``), every request drafts from it
# (``_prepare_draft_tokens``). A draft accepted shows in the response (several tokens per step, the step's latency).
# --------------------------------------------------------------------------------------------------------------

NGRAM_CORPUS = scheduler_scenario(r"""
import types
import numpy as np
import coverage_world as cw
from kvshield_sglang.errors import UnsupportedFeatureError
from sglang.srt.speculative.cpp_ngram import ngram_corpus
from sglang.srt.speculative.ngram_worker import NGRAMWorker

class Corpus:
    # SGLang's native trie (a JIT-built C++ kernel, not buildable here), as its Python wrapper calls it: sequences in,
    # and per query the continuation that follows the longest suffix of the query seen before (a draft chain)
    def __init__(self, draft_token_num, **kwargs):
        self.n, self.seqs = draft_token_num, []
    def insert(self, batch_tokens):
        self.seqs.extend(list(t) for t in batch_tokens)
    def synchronize(self):
        pass
    def match_stateful(self, state_ids, batch_tokens, total_lens):
        drafts = []
        for q in batch_tokens:
            nxt = next((s[i + k:i + k + self.n - 1] for k in range(len(q), 0, -1) for s in self.seqs
                        for i in range(len(s) - k) if s[i:i + k] == q[-k:]), [])
            drafts.extend(([q[-1]] + nxt + [0] * self.n)[:self.n])
        mask = np.tril(np.ones((self.n, self.n), dtype=np.int32))
        return np.array(drafts, dtype=np.int64), np.tile(mask.reshape(-1), len(batch_tokens))
ngram_corpus.get_ngram_corpus_cls = lambda: Corpus

with cw.settings("ZERO", accept=os.environ.get("ACCEPT", ""), speculative_algorithm="NGRAM",
                 speculative_num_draft_tokens=4) as sa:
    try:
        a = cw.build_allocator(MHAPool(16, 4), 16, 4, sa)
    except UnsupportedFeatureError as e:
        OUT["refused"] = str(e)
    else:
        a.close()
        w = NGRAMWorker.__new__(NGRAMWorker)  # its draft paths only: no model, GPU or graphs
        w.enable_overlap, w.draft_token_num, w.max_trie_depth = False, 4, 8
        w.ngram_corpus = ngram_corpus.NgramCorpus(max_trie_depth=8, draft_token_num=4)
        def batch(*reqs):
            return types.SimpleNamespace(reqs=list(reqs), grammar_needs_sync=lambda: False, spec_info=None)
        secret = servers.request("a", [11, 12, 13, 14], "tenant-a")
        secret.output_ids.extend([71, 72, 73, 74])       # tenant A's answer, verified and committed
        w._update_ngram_corpus(batch(secret))
        probe = servers.request("b", [5, 6, 13, 14], "tenant-b")   # tenant B's prompt ends as A's did
        drafts, _ = w._prepare_draft_tokens(batch(probe))
        OUT["drafts"] = [int(t) for t in drafts]
""")


def test_ngram_speculative_decoding_is_refused_or_drafts_no_other_tenants_tokens(jvm, tmp_path):
    """NGRAM keeps one n-gram corpus per scheduler, fed with every request's prompt and output tails and queried for
    every request's drafts: a tenant whose prompt ends as another tenant's did gets that tenant's continuation as
    its draft, and an accepted draft shows in its response (several tokens per step, the step's latency). Before
    the fix kvshield started with ``--speculative-algorithm NGRAM`` and said nothing. Promised: refused at start
    naming it (gap ``ngram-corpus``), or no draft of tenant B's holding tenant A's tokens."""
    out = run_scenario(tmp_path, NGRAM_CORPUS)
    assert "drafts" not in out, f"tenant B's NGRAM drafts after tenant A's request: {out['drafts']}"
    assert "--speculative-algorithm NGRAM" in out["refused"] and "KVSHIELD_ACCEPT_GAPS=ngram-corpus" in out["refused"], out


def test_twin_ngram_corpus_accepted_drafts_the_other_tenants_answer(jvm, tmp_path):
    out = run_scenario(tmp_path, NGRAM_CORPUS, ACCEPT="ngram-corpus")
    assert out.get("drafts") == [14, 71, 72, 73], out


# --------------------------------------------------------------------------------------------------------------
# EAGLE decode on SGLang's own path (``eagle_prepare_for_decode`` -> ``alloc_for_spec_decode``: each step allocates
# ahead of the committed length, page aligned; page size 4 with topk 3 reserves whole pages per branch), two
# tenants, then ``ScheduleBatch.retract_decode`` (``release_req`` -> ``release_kv_cache(is_insert=False)``: the
# committed KV and the over-allocated draft slots are freed) and a third tenant taking the released pages.
# --------------------------------------------------------------------------------------------------------------

SPEC_RETRACT = scheduler_scenario(r"""
import types
from sglang.srt.mem_cache import allocation
from sglang.srt.speculative import eagle_utils
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
PS, TOPK = int(os.environ["PS"]), int(os.environ["TOPK"])
servers.publish_server_args(attention_backend="torch_native", page_size=PS, speculative_algorithm="EAGLE",
                            speculative_num_steps=3, speculative_eagle_topk=TOPK, speculative_num_draft_tokens=4)
allocation.assign_req_to_token_pool_func = servers.assign_req_to_token_pool_on_cpu
last_loc = allocation.get_last_loc  # NOTE: torch 1.13 on CPU indexes with int64 only (SGLang passes int32 lengths)
allocation.get_last_loc = lambda rows, idx, lens: last_loc(rows, idx.long(), lens.long())
a, kv = allocator(PS, size=128)
if os.environ.get("PLANTED") == "unattributed-retraction":  # planted bug: the retraction's release is not hooked
    from sglang.srt.managers import schedule_batch  # NOTE: after start: a hook replaced before it stops the rank there
    schedule_batch.release_kv_cache = common.release_kv_cache.__wrapped__
cache = servers.radix_cache(a)
rows = cache.req_to_token_pool.req_to_token
CODE = {"acme": 1.0, "globex": 2.0, "initech": 3.0}
OUT["foreign"] = []
def reads(what, req, upto):
    got = set(kv.read(rows[req.req_pool_idx, :upto].long()).flatten().tolist()) - {0.0, CODE[req.kvshield_tenant]}
    if got:
        OUT["foreign"].append(f"{what}: {req.rid} ({req.kvshield_tenant}) reads {sorted(got)}")
x = servers.request("x", list(range(1, 7)), "acme", max_new_tokens=30)
y = servers.request("y", list(range(101, 107)), "globex", max_new_tokens=30)
with servers.single_rank():
    batch = servers.prefill(cache, [x, y])
write(kv, batch.out_cache_loc[:6], CODE["acme"])
write(kv, batch.out_cache_loc[6:], CODE["globex"])
batch.spec_algorithm = SpeculativeAlgorithm.from_string("EAGLE")
for step, accepted in enumerate(([2, 1], [3, 4], [1, 1])):
    with servers.single_rank():
        eagle_utils.eagle_prepare_for_decode(batch)
    for r, n in zip(batch.reqs, accepted):
        reads(f"decode step {step}", r, r.kv.kv_allocated_len)
        write(kv, rows[r.req_pool_idx, r.kv_committed_len:r.kv.kv_allocated_len].long(), CODE[r.kvshield_tenant])
        r.kv_committed_len += n
        r.output_ids.extend([7] * n)
    batch.seq_lens_cpu = torch.tensor([r.kv_committed_len for r in batch.reqs], dtype=torch.int64)
    batch.seq_lens = batch.seq_lens_cpu.clone()
with servers.single_rank():
    retracted, _, _ = batch.retract_decode(types.SimpleNamespace(disaggregation_mode="null", retraction_policy="length"))
OUT["retracted"] = [r.rid for r in retracted]
z = servers.request("z", list(range(201, 201 + 40)), "initech", max_new_tokens=1)
with servers.single_rank():
    zb = servers.prefill(cache, [z])
OUT["z_admitted"] = zb is not None
if zb is not None:
    reads("after the retraction", z, 40)
kept = batch.reqs[0]
reads("the request kept running", kept, kept.kv.kv_allocated_len)
for r in [kept] + ([z] if zb is not None else []):
    r.finished_reason, r.finished_len = FINISH_LENGTH(length=0), 0
    common.release_kv_cache(r, cache)
a.end_step()
OUT["rejected"], OUT["back"] = a.rejected_frees(), a.available_size() + cache.evictable_size()
""")


@pytest.mark.parametrize("page_size,topk", [(1, 1), (4, 1), (4, 3)])
def test_eagle_decode_and_retraction_hand_no_tenant_anothers_kv(jvm, tmp_path, page_size, topk):
    """Two tenants decode with EAGLE on SGLang's own allocation path, the draft and verify writing each request's
    whole reserve; SGLang retracts one; a third tenant prefills into what is free. Every slot each request reads
    (its row up to its allocated length) holds its own tenant's KV or zeros; the retraction's frees and the
    releases are all applied (none refused) and every page comes back."""
    out = run_scenario(tmp_path, SPEC_RETRACT, PS=str(page_size), TOPK=str(topk), KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["retracted"] == ["y"] and out["z_admitted"] and out["foreign"] == [], out
    assert out["rejected"] == 0 and out["back"] == 128, out


def test_twin_a_retraction_freeing_outside_its_release_keeps_the_draft_pages(jvm, tmp_path):
    out = run_scenario(tmp_path, SPEC_RETRACT, PS="4", TOPK="3", PLANTED="unattributed-retraction",
                       KVSHIELD_ADVERTISED_CONTEXT_TOKENS="128")
    assert out["rejected"] > 0 and out["back"] < 128, out
