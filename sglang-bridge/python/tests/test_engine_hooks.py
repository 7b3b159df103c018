"""The trusted tenant end to end: gateway header (or API key) in the HTTP/tokenizer process →
tokenized request (pickled across) → the scheduler's Req → page attribution, against the SGLang
stand-in (tests/stub_sglang) in a subprocess; and the hooks' probes when a target is missing."""

import json
import logging

from test_upstream_stub import _run

TENANT_RUN = r"""
import asyncio, pickle
import torch
from fakes import FakeMHAPool, extend_batch
from kvshield_sglang import plugin
from kvshield_sglang.tenants import TenantResolver
plugin.load()
from sglang.srt.managers.io_struct import GenerateReqInput
from sglang.srt.managers.scheduler import Scheduler
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.managers.tokenizer_manager import TokenizerManager
from sglang.srt.mem_cache import common
import sglang.srt.model_executor.model_runner as model_runner

class Request:  # FastAPI's request, as the HTTP entry points pass it: headers only matter here
    def __init__(self, headers):
        self.headers = headers

tm = TokenizerManager()
def send(obj, request):
    async def go():
        return [x async for x in tm.generate_request(obj, request)]
    return asyncio.run(go())

spoofed = GenerateReqInput(text="hello", rid="r1", custom={"kvshield_tenant": "globex"})
spoofed.kvshield_tenant = "globex"  # even a body field of this name set server-side is overwritten
send(spoofed, Request({"X-Tenant": "acme", "x-kvshield-tenant": "globex"}))
send(GenerateReqInput(text="body only", rid="r2", custom={"kvshield_tenant": "acme"}), Request({}))
send(GenerateReqInput(text="key", rid="r3"), Request({"authorization": "Bearer key-7"}))
send(GenerateReqInput(text="engine api", rid="r4"), None)

scheduler = Scheduler()
for blob in tm.sent:  # the process boundary: only what pickles crosses
    scheduler.handle_generate_request(pickle.loads(blob))
reqs = scheduler.waiting_queue
resolver = TenantResolver.from_env()
print("tenants", [resolver.resolve_request(r) for r in reqs])
print("outside", getattr(Req("x", "", []), "kvshield_tenant", "unset"))

a = model_runner.PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", FakeMHAPool(32, 4), False)
out = common.alloc_for_extend(extend_batch(a, reqs[:2], [4, 4]))
print("owners", [a.page_owner(int(s) // 4)[0] for s in out[::4]])
"""


def test_gateway_tenant_travels_from_the_http_request_to_the_schedulers_pages(jvm, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"key-7": "initech"}))
    r = _run(["-c", TENANT_RUN], tmp_path, KVSHIELD_TENANT_HEADER="X-Tenant", KVSHIELD_API_KEY_MAP=str(keys),
             KVSHIELD_ADVERTISED_CONTEXT_TOKENS="32")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "tenants ['acme', 'default', 'initech', 'default']" in r.stdout, r.stdout
    assert "outside None" in r.stdout, r.stdout
    assert "owners ['acme', 'default']" in r.stdout, r.stdout


def test_missing_hook_targets_are_logged_and_installed_nowhere(caplog):
    from kvshield_sglang import engine_hooks
    from kvshield_sglang.tenants import TenantResolver

    class SlotsOnly:  # a msgspec Struct keeps no per-instance dict
        __slots__ = ("rid",)

    class TokenizerManager:
        async def generate_request(self, obj, request=None):
            yield obj

    resolver = TenantResolver("X-Tenant")
    original = TokenizerManager.generate_request
    with caplog.at_level(logging.ERROR, logger="kvshield_sglang.engine_hooks"):
        assert not engine_hooks.install_tokenizer_side(None, SlotsOnly, resolver)
        assert not engine_hooks.install_tokenizer_side(TokenizerManager, SlotsOnly, resolver)
        assert not engine_hooks.install_scheduler_side(None, SlotsOnly)
        assert not engine_hooks.install_forward_hook(object)
    assert TokenizerManager.generate_request is original
    text = caplog.text
    assert "no TokenizerManager.generate_request; every request goes to the default tenant" in text
    assert "can carry an extra field (msgspec Struct)" in text
    assert "no Scheduler.handle_generate_request" in text
    assert "no ModelRunner.forward" in text
