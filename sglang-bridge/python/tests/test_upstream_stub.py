"""The subclass-SGLang path and the plug-in's hooks, against a stand-in of SGLang's modules
(tests/stub_sglang) in subprocesses, since SGLang itself cannot be installed here."""

import os
import subprocess
import sys

from conftest import TEST_CLASSES, require_module

HERE = os.path.dirname(os.path.abspath(__file__))
STUB = os.path.join(HERE, "stub_sglang")
PKG = os.path.dirname(HERE)


def _run(args, tmp_path, **env):
    e = dict(os.environ, PYTHONPATH=os.pathsep.join([STUB, PKG, HERE]), KVSHIELD_RANK_DIR=str(tmp_path),
             KVSHIELD_EXTRA_CLASSPATH=TEST_CLASSES, **env)
    return subprocess.run([sys.executable, *args], env=e, capture_output=True, text=True, timeout=300, cwd=PKG)


def test_contract_tests_pass_on_the_subclassed_upstream_classes(jvm, tmp_path):
    require_module("pytest")
    r = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "upstream", os.path.join(HERE, "test_contract.py")],
             tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "skipped" not in r.stdout, r.stdout[-1000:]


PLUGIN_RUN = r"""
import torch
from fakes import FakeMHAPool, extend_batch
import sglang.srt.model_executor.model_runner as model_runner
import sglang.srt.mem_cache.allocator.paged as stock_paged
from sglang.srt.mem_cache import common
from kvshield_sglang import allocator, plugin, ranks

stock = stock_paged.PagedTokenToKVPoolAllocator
plugin.load()
ours = model_runner.PagedTokenToKVPoolAllocator
assert ours is allocator.PagedTokenToKVPoolAllocator, ours
assert issubclass(ours, stock) and stock_paged.PagedTokenToKVPoolAllocator is ours

a = ours(32, 4, torch.float32, "cpu", FakeMHAPool(32, 4), False)  # SGLang's own call, settings from env

class Req:
    def __init__(self, rid, tenant):
        self.rid = rid
        self.kvshield_headers = {"X-Tenant": tenant}

b = extend_batch(a, [Req("r1", "acme"), Req("r2", "globex")], [5, 4])
out = common.alloc_for_extend(b)
assert out.tolist() == [4, 5, 6, 7, 8, 12, 13, 14, 15], out.tolist()
assert a.page_owner(1) == ("acme", a.request_id("r1")) and a.page_owner(2) == ("acme", a.request_id("r1"))
assert a.page_owner(3) == ("globex", a.request_id("r2"))

b.reqs[1].slots = b.reqs[0].slots  # a bookkeeping bug: globex's release names acme's pages
common.release_kv_cache(b.reqs[1], b.tree_cache)
assert a.rejected_frees() == 2 and a.page_owner(1)[0] == "acme"
common.release_kv_cache(b.reqs[0], b.tree_cache)
assert a.page_owner(1) == (None, -1)
print(ranks.verify([ranks.rank_name(0)])[ranks.rank_name(0)]["detail"])
"""


def test_plugin_replaces_allocators_and_attributes_pages_through_sglang_planning(jvm, tmp_path):
    r = _run(["-c", PLUGIN_RUN], tmp_path, KVSHIELD_TENANT_HEADER="X-Tenant", KVSHIELD_ADVERTISED_CONTEXT_TOKENS="32")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "PagedTokenToKVPoolAllocator level=ZERO" in r.stdout


DISAGG_RUN = r"""
import os
import torch
from fakes import FakeMHAPool
from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.decode import DecodeTransferQueue
from sglang.srt.disaggregation.prefill import PrefillBootstrapQueue
from sglang.srt.mem_cache import registry
from kvshield_sglang import plugin
from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
from kvshield_sglang.handoff import Handoff

plugin.load()
assert PrefillBootstrapQueue.add._kvshield and DecodeTransferQueue.pop_transferred._kvshield
assert registry.get_radix_cache_factory("kvshield") is not None

class Req:
    def __init__(self, rid, n, finished=None):
        self.rid, self.origin_input_ids, self.finished_reason, self.return_logprob = rid, list(range(n)), finished, False
    def finished(self):
        return self.finished_reason is not None

class Scheduler:
    def __init__(self, a):
        self.token_to_kv_pool_allocator, self.streamed = a, []
    def stream_output(self, reqs, return_logprob):
        self.streamed.extend(reqs)

pa = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", FakeMHAPool(32, 4), False)
da = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", FakeMHAPool(32, 4), False)
q = PrefillBootstrapQueue(Scheduler(pa))
placeholder = Req("big", 1, finished="length")  # SGLang shrank a rejected prompt to one token
q.add(placeholder, 1)
assert q.queue == [] and q.scheduler.streamed == [placeholder]
assert placeholder.finished_reason.to_json()["type"] == "abort" and placeholder.finished_reason.status_code == 400

prefill, decode = Handoff(pa), Handoff(da)
prefill.handshake(1, decode.effective_limit()); decode.handshake(1, prefill.effective_limit())
da.kvshield_handoff = decode
pa.set_plan([("r", "t1", 0, 8)]); slots = pa.alloc(8); pa.clear_plan()
prefill.begin("r", "t1", 8, slots, 1)
decode.reserve("r", "t1", 8, 1)
prefill.copy_to(decode, "r", 0, 1); prefill.mark_sent("r", 4)
req = Req("r", 8); req.kvshield_covered_tokens = prefill.sent_tokens("r")
class Receiver:
    def poll(self):
        return KVPoll.Success
    def clear(self):
        pass
class DecodeRequest:
    def __init__(self, req):
        self.req, self.kv_receiver = req, Receiver()
dq = DecodeTransferQueue(Scheduler(da)); dq.queue = [DecodeRequest(req)]
assert dq.pop_transferred() == []
assert req.finished_reason.to_json()["type"] == "abort" and req.finished_reason.status_code == 500, req.finished_reason
print("disagg hooks ok")
"""


def test_plugin_hooks_sglang_disaggregation_and_registers_the_prefix_backend(jvm, tmp_path):
    r = _run(["-c", DISAGG_RUN], tmp_path, KVSHIELD_ADVERTISED_CONTEXT_TOKENS="32", KVSHIELD_STRICT="true")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "disagg hooks ok" in r.stdout
    assert "handoff-isolation fix" in r.stderr  # the stub has no rejected-request check: a loud warning


def test_compliance_refuses_an_sglang_without_the_handoff_fix_unless_overridden(jvm, tmp_path):
    run = "from kvshield_sglang import plugin\nplugin.load()\nprint('loaded')"
    refused = _run(["-c", run], tmp_path, KVSHIELD_LEVEL="COMPLIANCE")
    assert refused.returncode != 0 and "COMPLIANCE refuses to start" in refused.stderr, refused.stderr[-2000:]
    allowed = _run(["-c", run], tmp_path, KVSHIELD_LEVEL="COMPLIANCE", KVSHIELD_ALLOW_UNFIXED_HANDOFF="1")
    assert allowed.returncode == 0 and "loaded" in allowed.stdout, allowed.stderr[-2000:]
