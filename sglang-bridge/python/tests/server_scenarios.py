"""Scenarios run in a subprocess on the real SGLang (the plug-in replaces SGLang's classes process-wide): a body
after one of three preludes that load the plug-in and set the scene. :func:`scheduler_scenario`: ``servers``
(SGLang's own ``Req``, ``ReqToTokenPool``, radix cache, ``PrefillAdder``, ``ScheduleBatch``, ``Session``) over a
CPU ``MHAPool``; :func:`session_scenario`: ``session_world.World`` (kvshield's allocator, SGLang's streaming
sessions), the body on one rank; :func:`tokenizer_scenario`: SGLang's ``TokenizerManager`` and ``Scheduler``
entry points, the tenant in a gateway header. A body records its findings in ``OUT``; :func:`run_scenario` runs
one and returns them."""

import dataclasses

import scenarios
from conftest import TEST_CLASSES

MARK = "REPORT "

_SCHEDULER = r"""
import json, os, torch
from kvshield_sglang import plugin
plugin.load()
import servers
from fakes import MHAPool
import sglang.srt.mem_cache.allocator.paged as paged
import sglang.srt.mem_cache.allocator.token as token
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_LENGTH
from sglang.srt.session.session_controller import Session
servers.publish_server_args(attention_backend="torch_native")
OUT = {}
def done():
    print("REPORT " + json.dumps(OUT))

def allocator(ps, size=64):
    kv = MHAPool(size, ps)
    if ps == 1:
        return token.TokenToKVPoolAllocator(size, torch.float32, "cpu", kv, False), kv
    return paged.PagedTokenToKVPoolAllocator(size, ps, torch.float32, "cpu", kv, False), kv

def write(kv, slots, value):
    for b in kv.buffers():
        b[slots] = value

def first_turn(a, kv, cache, sess, tokens, value):
    # One streaming-session turn as SGLang runs it: the session's request is admitted and prefilled
    # (PrefillAdder + prepare_for_extend), the forward writes its KV, it finishes and the scheduler
    # releases it (release_kv_cache: UnifiedRadixCache's embedded StreamingSession keeps its KV in the
    # session slot for the next turn).
    req = servers.request("turn1", tokens, "acme", session=sess)
    sess._inflight = True  # Session.create_req sets it for a streaming turn
    with servers.single_rank():
        batch = servers.prefill(cache, [req])
    write(kv, batch.out_cache_loc, value)
    req.kv_committed_len = len(tokens)
    req.finished_reason, req.finished_len = FINISH_LENGTH(length=0), 0
    row = req.req_pool_idx
    common.release_kv_cache(req, cache)
    return cache.req_to_token_pool.req_to_token[row, :len(tokens)].to(torch.int64)
"""

_SESSION_WORLD = r"""
import json, os, torch
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
from kvshield_sglang import disagg, tenants
PLANTED = os.environ.get("PLANTED")
if PLANTED == "shared-prefix-counted":      # the tenant's worst case counts the shared namespace's pages
    tenants.foreign_prefix_pages = lambda req, page_size: 0
elif PLANTED == "decode-queues-skipped":    # the decode quota skips the waiting and retracted queues
    disagg._live_decode_reqs = lambda q: list(q.scheduler.running_batch.reqs) + [d.req for d in q.queue] + [
        d.req for d in q.transfer_queue.queue]
elif PLANTED == "abort-keeps-match":        # the quota abort keeps the whole input's fill ids and match
    plugin._abort_unprefilled = lambda req, why: req.set_finish_with_abort(why)
OUT = {}
def done():
    print("REPORT " + json.dumps(OUT))
"""

_TOKENIZER = r"""
import json, os, pickle, torch
from kvshield_sglang import plugin, tenants
PLANTED = os.environ.get("PLANTED")
if PLANTED == "no-rebind":           # a copy sent under a new id keeps the envelope sealed for the first id
    tenants.TenantChannel.rebind = lambda self, value, rid: value
elif PLANTED == "items-only":        # headers read through items() only (Starlette's), as before the fix
    tenants._header = lambda headers, name: next((v for k, v in headers.items() if k.lower() == name), None)
elif PLANTED in ("open-unchecked", "unchecked"):  # an open may take an id whose streaming slot is still held
    plugin._streaming_slots = lambda tree_cache: {}
if PLANTED == "unchecked":           # and a turn's match restores a slot kept for another session object
    plugin._kept_for_another = lambda slot, session: False
plugin.load()
import servers
from fakes import MHAPool
from kvshield_sglang.tenants import TenantResolver
from sglang.srt.managers.io_struct import GenerateReqInput
import sglang.srt.mem_cache.allocator.paged as paged
servers.publish_server_args(attention_backend="torch_native")
OUT = {}
class Request:  # FastAPI's request as the HTTP entry points pass it: only its headers matter here
    def __init__(self, headers):
        self.headers = headers
def done():
    print("REPORT " + json.dumps(OUT))
"""


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A body and the prelude it runs after; ``env`` holds the settings it runs under unless a test names others."""

    prelude: str
    body: str
    env: tuple = ()


def scheduler_scenario(body):
    """``body`` after SGLang's scheduler pieces (``servers``, ``MHAPool``, ``allocator``/``write``/``first_turn``)."""
    return Scenario(_SCHEDULER, body)


def session_scenario(body):
    """``body`` on one rank after ``session_world`` (planted bugs picked by ``PLANTED``)."""
    return Scenario(_SESSION_WORLD,
                    "with servers.single_rank():\n" + "\n".join("    " + line for line in body.splitlines()))


def tokenizer_scenario(body):
    """``body`` after SGLang's tokenizer and scheduler entry points, the tenant in the ``X-Tenant`` header."""
    return Scenario(_TOKENIZER, body,
                    (("KVSHIELD_TENANT_HEADER", "X-Tenant"), ("KVSHIELD_ADVERTISED_CONTEXT_TOKENS", "512")))


def run_scenario(tmp_path, scenario, plant="", **env):
    """Runs ``scenario``; ``plant`` runs before the plug-in loads (a planted bug, or an SGLang variant). Returns what
    its body put in ``OUT``."""
    for name, value in scenario.env:
        env.setdefault(name, value)
    code = scenario.prelude.replace("plugin.load()\n", plant + "\nplugin.load()\n", 1) + scenario.body + "\ndone()\n"
    return scenarios.run_reporting(code, MARK, tmp_path, TEST_CLASSES, **env)
