"""A client's abort reaches only its own tenant's requests (``engine_hooks.install_abort_scoping``). SGLang's
scheduler aborts every request whose rid *starts with* the abort's, and its tokenizer sends a client's rid with no
tenant (a disconnect, ``/abort_request``): globex's client ending its ``job-1`` would end acme's running ``job-10``.

Driven on SGLang's own ``TokenizerManager.abort_request`` (one tokenizer worker per tenant, as with several HTTP
workers) and ``Scheduler.abort_request`` over ``scheduler_world``'s scheduler (kvshield's allocator, SGLang's
batches, CPU), and on an EPD receiver's ``abort_waiting_requests``; each check reads the pages the pool holds for
the request, its output tokens and the oracle's reads of the KV bytes, or a waiting request's status. The twin drops the tenant scoping of SGLang's matching and must see acme's request end."""

import pytest

import scenarios
from conftest import TEST_CLASSES

_MARK = "ABORTS "

_SCRIPT = r"""
import json, os, pickle, types
from kvshield_sglang import plugin
plugin.load()
import servers, wire
import scheduler_world as sw
from sglang.srt.disaggregation.encoder.receiver import (MMReceiverBase, WaitingMMRequestBase,
                                                        WaitingMMRequestStatus, WaitingZmqRequest)
from sglang.srt.managers.io_struct import AbortReq, GenerateReqInput
from sglang.srt.managers.schedule_batch import Req
wire.install(); servers.one_process_group()
if os.environ.get("PLANTED") == "unscoped-match":
    del Req.rid, WaitingMMRequestBase.rid  # planted bug: the abort's tenant is opened, SGLang matches every tenant's


def waiting_for_embeddings(tenant, rid):
    # an EPD language-only request still waiting for its encoder embeddings: its tokenized request is still sealed
    tm = w.tokenizers[tenant]
    servers.send(tm, GenerateReqInput(input_ids=[5, 6], rid=rid), types.SimpleNamespace(headers={"X-Tenant": tenant}))
    waiting = WaitingZmqRequest.__new__(WaitingZmqRequest)  # no encoder sockets or GPU buffers here
    waiting.rid, waiting.recv_req = rid, pickle.loads(pickle.dumps(tm.sent[-1]))
    waiting.status = WaitingMMRequestStatus.PENDING
    waiting._fail_and_release = lambda msg, error_code=None: setattr(waiting, "status", WaitingMMRequestStatus.FAIL)
    waiting.release_resources = lambda: None
    return waiting


w = sw.World(sw.Config("kvshield", "unified", 4))
acme = w.submit("job-10", "acme", [1000 + i for i in range(12)], 12, tokenizer="acme")
globex = w.submit("job-1", "globex", [2000 + i for i in range(12)], 12, tokenizer="globex")
for _ in range(3):
    w.step()
held = lambda t: int(w.alloc._j.heldPages(w.alloc.request_id(t.req)))
OUT = {"before": {"acme": held(acme), "globex": held(globex)}}
if os.environ.get("ABORT") == "all":
    w.send_abort("acme", abort_all=True)  # SGLang's own (pause_generation, weight updates): every tenant's end
else:
    # an abort with no tenant sealed (an entry point that never sealed, a forged one): refused, nothing ends
    w.sched.abort_request(AbortReq(rid="job-1"))
    w.step()
    OUT["unsealed"] = {"acme": held(acme), "globex": held(globex)}
    w.abort("job-1")  # globex's client disconnects: its tokenizer sends the abort of its own rid
    waiting = {t: waiting_for_embeddings(t, rid) for t, rid in (("acme", "img-10"), ("globex", "img-1"))}
    receiver = w.sched.mm_receiver = types.SimpleNamespace(waiting_list=list(waiting.values()))
    receiver.abort_waiting_requests = types.MethodType(MMReceiverBase.abort_waiting_requests, receiver)
    w.send_abort("globex", rid="img-1")
    w.sched.mm_receiver = None
    OUT["waiting"] = {t: r.status.name for t, r in waiting.items()}
w.step()
OUT["after"] = {"acme": held(acme), "globex": held(globex)}
for _ in range(60):
    if w.drained():
        break
    w.step()
OUT["output"] = {"acme": len(acme.req.output_ids), "globex": len(globex.req.output_ids)}
OUT["reads"] = w.oracle.reads
print("ABORTS " + json.dumps(OUT))
"""


def _run(tmp_path, **env):
    return scenarios.run_reporting(_SCRIPT, _MARK, tmp_path, TEST_CLASSES, KVSHIELD_TENANT_HEADER="X-Tenant", **env)


def test_another_tenants_abort_never_ends_a_tenants_request_whose_rid_it_prefixes(jvm, tmp_path):
    out = _run(tmp_path)
    assert out["reads"] == 0, out
    assert out["before"]["acme"] > 0 and out["before"]["globex"] > 0, out
    assert out["unsealed"] == out["before"], f"an abort without a sealed tenant ended a request: {out}"
    assert out["after"]["acme"] == out["before"]["acme"], f"acme's request lost its KV pages to globex's abort: {out}"
    assert out["output"]["acme"] == 12, f"acme's request was cut short by globex's abort of job-1: {out}"
    assert out["output"]["globex"] < 12 and out["after"]["globex"] == 0, \
        f"globex's own abort did not end its request and release its pages: {out}"
    assert out["waiting"] == {"acme": "PENDING", "globex": "FAIL"}, \
        f"globex's abort of img-1 reached acme's img-10 waiting for its embeddings: {out}"


def test_sglangs_own_abort_all_still_ends_every_tenants_requests(jvm, tmp_path):
    out = _run(tmp_path, ABORT="all")
    assert out["reads"] == 0, out
    assert out["after"] == {"acme": 0, "globex": 0}, out
    assert out["output"]["acme"] < 12 and out["output"]["globex"] < 12, out


@pytest.mark.parametrize("planted", ["unscoped-match"])
def test_twin_matching_every_tenants_rids_ends_the_other_tenants_request(jvm, tmp_path, planted):
    out = _run(tmp_path, PLANTED=planted)
    assert out["after"]["acme"] == 0 and out["output"]["acme"] < 12, \
        f"the twin's globex abort of job-1 should have ended acme's job-10: {out}"
    assert out["waiting"]["acme"] == "FAIL", out
