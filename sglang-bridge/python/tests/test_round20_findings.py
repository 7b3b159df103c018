"""Round 20 (prefix sharing across tenants, the tree caches): reproductions that fail on the current code.

Each test drives SGLang's own classes (``Req``, ``ReqToTokenPool``, the scheduler's ``abort_request``) over
kvshield's allocator and tree caches on CPU, and asserts on what the pool holds (page owners, pool
accounting) or on what the tree keeps, never on a status alone.
"""

import scenarios
from conftest import TEST_CLASSES


# ---------------------------------------------------------------- 2. another tenant's abort by rid prefix


_ABORT = r"""
import json
from kvshield_sglang import plugin
plugin.load()
import servers, wire
import scheduler_world as sw
wire.install(); servers.one_process_group()
from sglang.srt.managers.io_struct import AbortReq
w = sw.World(sw.Config("kvshield", "unified", 4))
acme = w.submit("job-10", "acme", [1000 + i for i in range(12)], 12, tokenizer="acme")
globex = w.submit("job-1", "globex", [2000 + i for i in range(12)], 12, tokenizer="globex")
for _ in range(3):
    w.step()
alloc = w.alloc
held = lambda t: int(alloc._j.heldPages(alloc.request_id(t.req)))
before = held(acme)
# globex's client disconnects (or calls /abort_request with its own rid): TokenizerManager sends AbortReq(rid)
w.sched.abort_request(AbortReq(rid="job-1"))
w.step()
after = held(acme)
for _ in range(60):
    if w.drained():
        break
    w.step()
print("ABORT " + json.dumps({"held_before": before, "held_after": after, "acme_output": len(acme.req.output_ids),
                             "globex_output": len(globex.req.output_ids), "reads": w.oracle.reads}))
"""


def test_another_tenants_abort_never_releases_a_tenants_running_request(jvm, tmp_path):
    """Promised (promise 3 and the attack surface "client-chosen rid collisions across tenants"): a request's KV is
    released only at its own finish, abort or retraction; another tenant's client cannot end it.

    What happens: the plug-in hooks no abort path. SGLang's ``Scheduler.abort_request`` aborts every queued,
    chunked and running request whose ``rid`` *starts with* the abort's rid, whatever its tenant
    (``scheduler.py`` ``abort_request``: ``req.rid.startswith(recv_req.rid)``), and ``TokenizerManager`` sends that
    abort for a client's own rid when it disconnects or calls ``/abort_request``. So globex's client, whose request
    is ``job-1``, ends acme's running request ``job-10``: acme's KV pages are released under it (its pool holds drop
    to 0) and acme's output stops at 3 of its 12 tokens."""
    out = scenarios.run_reporting(_ABORT, "ABORT ", tmp_path, TEST_CLASSES, KVSHIELD_TENANT_HEADER="X-Tenant")
    assert out["reads"] == 0, out
    assert out["held_after"] == out["held_before"] > 0, \
        f"acme's running request lost its KV pages to globex's abort of its own rid: {out}"
    assert out["acme_output"] == 12, f"acme's request was cut short by another tenant's abort: {out}"


# ---------------------------------------------------------------- 4. a client's extra_key is rewritten, not kept


_EXTRA_KEY = r"""
import json, torch
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
OUT = {}
with servers.single_rank():
    w = session_world.World("unified", 4)
    a = servers.request("acme-plain", list(range(100, 112)), "acme")
    a.extra_key = "user:alice"  # the application's per-user namespace within its tenant
    batch = w._prefill(a)
    w._write(batch, a, 1, 5)
    a.kv_committed_len = 12
    w.finish(a)
    for extra in ("user:alice", "user:bob", "kvshield-tenant:3:bob|user:alice"):
        r = servers.request(f"acme-{extra}", list(range(100, 112)) + [7], "acme")
        r.extra_key = extra
        r.init_next_round_input(w.cache)
        got = w.kv.read(r.prefix_indices.to(torch.int64))[0, :, 0, 0].tolist()
        OUT[extra] = {"matched": len(got), "stored": r.__dict__.get("_kvshield_extra_key")}
print("EXTRAKEY " + json.dumps(OUT))
"""


def test_a_clients_extra_key_is_kept_verbatim_not_rewritten_into_another_namespace(jvm, tmp_path):
    """Promised (promise 1: "SGLang's ``cache_salt``/``extra_key`` kept"): the tree namespace is the request's tenant
    *and* the client's ``extra_key`` as sent, so two different ``extra_key`` values of one tenant never share a
    cached prefix (SGLang's own contract: ``extra_key`` keeps caller-defined classes apart; applications use it per
    end user, and SGLang appends ``lora_id`` to it so adapters never share KV).

    What happens: ``Req.extra_key``'s setter (``engine_hooks._namespace_trees_by_tenant`` ``set_``) stores
    ``client_extra_key(value)``, which strips a well-formed ``kvshield-tenant:<len>:<name>|`` head from *the client's
    own value* (meant only for SGLang re-assigning the namespaced value it read). A client that sends
    ``extra_key="kvshield-tenant:3:bob|user:alice"`` lands in namespace ``user:alice`` and reads the prefix cached by
    another end user's ``user:alice`` request of the same tenant; the same strip lets a request without an adapter
    land in a LoRA adapter's namespace (``extra_key + lora_id``) and write base-model KV that the adapter's requests
    then read."""
    out = scenarios.run_reporting(_EXTRA_KEY, "EXTRAKEY ", tmp_path, TEST_CLASSES)
    assert out["user:alice"]["matched"] == 12 and out["user:bob"]["matched"] == 0, out  # the namespaces work
    forged = out["kvshield-tenant:3:bob|user:alice"]
    assert forged["matched"] == 0, (f"a request whose client extra_key is 'kvshield-tenant:3:bob|user:alice' was "
                                    f"stored as {forged['stored']!r} and read user:alice's cached prefix: {out}")
