"""COMPLIANCE through the bridge: the allocator's pool writes its signed audit trail (``KVSHIELD_AUDIT_SIGNING_KEY``,
``KVSHIELD_AUDIT_DIR``), or the allocator refuses to start naming the missing setting; the trail ships its
checkpoints off the host, is sealed at a normal exit, summarises each finished request under its ``rid``, and
reads back with the audit tools (hostile trail files among them)."""

import json
import os

import pytest

import scenarios
from conftest import TEST_CLASSES, require_module
from fakes import MHAPool
from trail_tools import NamedRequest, audit_tool, serve_one, signing_keys

torch = require_module("torch")


def _allocator(**settings):
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                       kvshield_settings=dict(settings, advertisedContextTokens=16))


def _verify(trail, pub):
    import jpype

    Path = jpype.JClass("java.nio.file.Path")
    keys = jpype.JClass("dev.kvshield.audit.AuditKeys")
    report = jpype.JClass("dev.kvshield.audit.AuditVerifier").verify(
        jpype.JClass("java.util.List").of(Path.of(str(trail))), keys.loadPublicKey(Path.of(str(pub))))
    return bool(report.ok()), [str(p) for p in report.problems()]


def _records(trail):
    return [json.loads(line) for f in sorted(trail.iterdir()) for line in f.read_text().splitlines() if line]


def test_compliance_refuses_to_start_without_its_audit_trail_naming_the_setting(jvm, tmp_path, monkeypatch):
    from kvshield_sglang.errors import KvShieldError

    key, _ = signing_keys(tmp_path)
    monkeypatch.delenv("KVSHIELD_AUDIT_SIGNING_KEY", raising=False)
    monkeypatch.delenv("KVSHIELD_AUDIT_DIR", raising=False)
    with pytest.raises(KvShieldError, match="COMPLIANCE writes a signed audit trail; auditSigningKey is not set"):
        _allocator(level="COMPLIANCE")
    monkeypatch.setenv("KVSHIELD_AUDIT_SIGNING_KEY", str(key))
    with pytest.raises(KvShieldError, match="COMPLIANCE writes a signed audit trail; auditDir is not set"):
        _allocator(level="COMPLIANCE")


def _compliance(tmp_path, monkeypatch):
    key, pub = signing_keys(tmp_path)
    trail = tmp_path / "trail"
    monkeypatch.setenv("KVSHIELD_AUDIT_SIGNING_KEY", str(key))
    monkeypatch.setenv("KVSHIELD_AUDIT_DIR", str(trail))
    return trail, pub


def _compliance_with_trail(tmp_path, monkeypatch):
    """A COMPLIANCE allocator writing its trail under ``tmp_path``, request r1 of acme holding 8 slots:
    (allocator, slots, trail dir, public key)."""
    trail, pub = _compliance(tmp_path, monkeypatch)
    a = _allocator(level="COMPLIANCE")
    a.set_plan([("r1", "acme", 0, 8)])
    slots = a.alloc(8)
    a.clear_plan()
    return a, slots, trail, pub


def test_compliance_writes_a_signed_trail_of_every_freed_page(jvm, tmp_path, monkeypatch):
    a, slots, trail, pub = _compliance_with_trail(tmp_path, monkeypatch)
    with a.releasing("acme", "r1"):
        a.free(slots)
    a.end_step()
    a.close()
    assert _verify(trail, pub) == (True, [])
    records = _records(trail)
    pages = sorted({int(s) // 4 for s in slots.tolist()})
    for page in pages:
        seen = {r["type"] for r in records if any(e[0] == page for e in r.get("pages", []))}  # format 2: batched
        assert {"allocate", "release", "free"} <= seen, (page, seen)
    # Twin: one record removed from the middle of the chain; the same oracle must see it.
    f = sorted(trail.iterdir())[0]
    lines = f.read_text().splitlines()
    f.write_text("\n".join(lines[:2] + lines[3:]) + "\n")
    ok, problems = _verify(trail, pub)
    assert not ok and problems, "a trail missing a record verified"


def test_compliance_trail_records_each_refused_free_by_who_presented_it_and_one_release(jvm, tmp_path, monkeypatch):
    """Under leases the trail names who presented each free: a stale engine free of a request's slots and
    another tenant's request are refused as foreign, the request's own release is the one release, its
    second release a double free; each refusal left the pages with their request."""
    import jpype

    a, slots, trail, pub = _compliance_with_trail(tmp_path, monkeypatch)
    a.free(slots)  # no request context
    with a.releasing("globex", "r2"):
        a.free(slots)
    assert a.page_owner(int(slots[0]) // 4) == ("acme", a.request_id("r1"))
    with a.releasing("acme", "r1"):
        a.free(slots)
    with a.releasing("acme", "r1"):
        a.free(slots)  # the request released a second time
    assert a.rejected_frees() == 6  # two pages, three refused frees
    a.end_step()
    a.close()
    assert _verify(trail, pub) == (True, [])
    pages = sorted({int(s) // 4 for s in slots.tolist()})
    unattributed = int(jpype.JClass("dev.kvshield.bridge.SlotAllocator").UNATTRIBUTED)
    acme, globex, r1, r2 = a.tenant_id("acme"), a.tenant_id("globex"), a.request_id("r1"), a.request_id("r2")
    seen = [(r["type"], r.get("tenant"), r.get("req")) for r in _records(trail)
            if r["type"] == "release" or r["type"].startswith("reject")
            if sorted(e[0] for e in r.get("pages", [])) == pages]
    assert seen == [("reject_foreign", None, unattributed), ("reject_foreign", globex, r2), ("release", acme, r1),
                    ("reject_double_free", acme, r1)]


_SERVED_THROUGH_SGLANG = r'''
import json, os
from kvshield_sglang import allocator, plugin
if os.environ.get("PLANTED") == "no-summary":  # planted bug: the bridge never records a request's end
    allocator._KvShieldMixin.request_released = lambda self, req, tenant, outcome: None
plugin.load()
import servers, torch
from fakes import MHAPool
from sglang.srt.mem_cache import common
from sglang.srt.managers.schedule_batch import FINISH_ABORT, FINISH_LENGTH
import sglang.srt.mem_cache.allocator.paged as paged
servers.publish_server_args(attention_backend="torch_native")
with servers.single_rank():
    a = paged.PagedTokenToKVPoolAllocator(64, 4, torch.float32, "cpu", MHAPool(64, 4), False)
    cache = servers.radix_cache(a)
    done = servers.request("client-rid-attack14-7f3a", [1, 2, 3, 4, 5], "acme")
    aborted = servers.request("rid-aborted\x1b[2J", [6, 7, 8], "globex")
    servers.prefill(cache, [done, aborted])
    for r in (done, aborted):
        r.kv_committed_len = len(r.origin_input_ids)
    done.finished_reason, done.finished_len = FINISH_LENGTH(length=0), 1
    aborted.finished_reason = FINISH_ABORT("client")
    for r in (done, aborted):
        common.release_kv_cache(r, cache)
    a.end_step()
    print("IDS " + json.dumps({"done": a.request_id(done), "aborted": a.request_id(aborted),
                              "acme": a.tenant_id("acme"), "globex": a.tenant_id("globex")}), flush=True)
# the process ends as a scheduler's does on a normal exit: nothing closes the allocator but kvshield itself
'''


def _served_through_sglang(tmp_path, monkeypatch, **env):
    import scenarios
    from conftest import TEST_CLASSES

    trail, pub = _compliance(tmp_path, monkeypatch)
    ids = scenarios.run_reporting(_SERVED_THROUGH_SGLANG, "IDS ", tmp_path, TEST_CLASSES, KVSHIELD_LEVEL="COMPLIANCE",
                                  KVSHIELD_ALLOW_UNFIXED_HANDOFF="1", **env)
    return trail, pub, ids


def test_bridge_trail_summarises_each_finished_request_under_its_rid(jvm, tmp_path, monkeypatch):
    """Promise (README "Compliance mode and the audit trail": "one summary per finished request"; the trail names
    exactly which requests were affected). Found: nothing in the bridge called AuditTrail.requestFinished, and the
    client's rid appeared in no record, so an operator holding "request 0" could not find the SGLang request. Through
    SGLang's own release (``release_kv_cache``) a finished and an aborted request each get a summary with their
    outcome and their rid as label (control characters escaped), and `audit request RID` finds it."""
    trail, pub, ids = _served_through_sglang(tmp_path, monkeypatch)
    summaries = {r["req"]: r for r in _records(trail) if r["type"] == "summary"}
    assert set(summaries) == {ids["done"], ids["aborted"]}, f"summaries of requests {sorted(summaries)}, expected {ids}"
    done, aborted = summaries[ids["done"]], summaries[ids["aborted"]]
    assert (done["tenant"], done["outcome"], done["label"]) == (ids["acme"], "completed", "client-rid-attack14-7f3a")
    assert (aborted["tenant"], aborted["outcome"]) == (ids["globex"], "aborted")
    assert aborted["label"] == "rid-aborted\\x1b[2J", aborted["label"]
    status, out, err = audit_tool("request", "client-rid-attack14-7f3a", str(trail))
    assert status == 0 and "client-rid-attack14-7f3a" in out and "completed" in out, out + err
    status, out, _ = audit_tool("verify", "--pubkey", str(pub), str(trail))
    assert status == 0 and out.startswith("OK"), out


def test_twin_a_bridge_that_never_records_a_requests_end_fails_the_summary_oracle(jvm, tmp_path, monkeypatch):
    trail, _, _ = _served_through_sglang(tmp_path, monkeypatch, PLANTED="no-summary")
    assert not [r for r in _records(trail) if r["type"] == "summary"]


def test_audit_request_over_a_bridge_audit_dir_shows_one_request_not_two_boots(jvm, tmp_path, monkeypatch):
    """Promise (README Quick start: `./kvshield audit request ID DIR...`; AuditTool: "request ID ... the
    history of one request"; bridge README: KVSHIELD_AUDIT_DIR holds one trail per pool a process opens,
    "a restarted server's beside the earlier ones"). Each allocator mints request ids from 0, so the
    first request of a server and the first request of the server restarted beside it are both
    `request 0`. `audit request 0 DIR` over the bridge's audit directory prints both histories as one,
    here a release by tenant acme and a release by tenant globex (both written as tenant id 1: tenant ids
    too are minted per pool, so only each trail's tenant record tells them apart, which `audit request`
    does not print), as one request's records: the tool joins two different SGLang requests of two tenants under one
    request id (nothing tells the operator to pass one trail's files, and the output's summary line
    says "N record(s) for request 0"). Severity: low-medium (wrong attribution in the forensic tool)."""
    trail, _ = _compliance(tmp_path, monkeypatch)
    first = _allocator(level="COMPLIANCE")
    r1 = NamedRequest("first-server-request")
    serve_one(first, r1, "acme")
    id1 = first.request_id(r1)
    first.close()
    second = _allocator(level="COMPLIANCE")  # the server restarted: its trail lands beside the first
    r2 = NamedRequest("second-server-request")
    serve_one(second, r2, "globex")
    id2 = second.request_id(r2)
    second.close()
    assert id1 == id2 == 0, (id1, id2)
    names = {(r["trail"], r["tenant"]): r["name"] for r in _records(trail) if r["type"] == "tenant"}
    # Fixed (lead's rule: keep trails apart, or refuse the ambiguity): a request id found in two trails is refused,
    # naming both trails, and --trail picks one.
    status, out, err = audit_tool("request", "0", "--json", str(trail))
    assert status == 1 and out == "" and all(t in err for t, _ in names) and "--trail" in err, (status, out, err)
    (acme_trail,) = [t for (t, _), name in names.items() if name == "acme"]
    status, out, err = audit_tool("request", "0", "--trail", acme_trail, "--json", str(trail))
    assert status == 0, err
    events = json.loads(out)
    released_by = sorted({names[(e["trail"], e["tenant"])] for e in events if e["type"] == "release"})
    trails = {e["trail"] for e in events}
    assert len(trails) == 1 and len(released_by) == 1, (
        f"`audit request 0` merged {len(trails)} trails: releases by tenants {released_by} (both written as tenant id"
        f" {sorted({e['tenant'] for e in events if e['type'] == 'release'})}) of two different requests are shown as one"
        f" request's history: {out.strip().splitlines()[-1] if not out.strip().startswith('[') else len(events)} events")


_SERVER_THAT_EXITS = '''
import os, sys
tests = sys.argv[1]
sys.path.insert(0, os.path.dirname(tests))
sys.path.insert(0, tests)
import sglang_source
sglang_source.setup()
import torch
from kvshield_sglang import runtime
runtime.ensure_jvm()
from fakes import MHAPool
from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
a = PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                kvshield_settings=dict(level="COMPLIANCE", advertisedContextTokens=16))
a.set_plan([("r1", "acme", 0, 8)])
slots = a.alloc(8)
a.clear_plan()
with a.releasing("acme", "r1"):
    a.free(slots)
a.end_step()
print("SERVED", flush=True)
# The scheduler process ends here as SGLang's does: nothing in the bridge or SGLang calls the allocator's close().
'''


def test_a_bridge_trail_of_a_server_that_stopped_verifies(jvm, tmp_path, monkeypatch):
    """Promise (README: a signed checkpoint "every 10,000 records and at close"; `audit verify` exits "0 only
    when all is well, 2 naming each problem" and refuses a trail that is cut; bridge README: "verify each
    trail's files with ./kvshield audit verify"). The bridge writes its trail only from PagedTokenToKVPoolAllocator,
    and nothing on the serving path ever closes it: allocator.close() has no caller in kvshield_sglang (no
    atexit hook, no shutdown hook in SlotAllocator or the JVM side), and SGLang never closes an allocator. A
    COMPLIANCE process that served a request and exited normally (here: the interpreter ends after its
    step) leaves a trail with no checkpoint at all: `audit verify` says "FAILED ... tail is not sealed by a
    final checkpoint ... last signed checkpoint is seq -1". So every trail of every bridge server that ever
    stops fails verification exactly as a truncated, tampered trail does (the operator cannot tell them
    apart), and everything a server wrote since its last 10,000-record checkpoint (for a quiet server: all
    of it) is never signed. Severity: high (the COMPLIANCE audit trail cannot verify on the production path)."""
    import os
    import subprocess
    import sys

    trail, pub = _compliance(tmp_path, monkeypatch)
    tests = os.path.dirname(os.path.abspath(__file__))
    child = subprocess.run([sys.executable, "-c", _SERVER_THAT_EXITS, tests], env=dict(os.environ), capture_output=True,
                           text=True, timeout=300)
    assert child.returncode == 0 and "SERVED" in child.stdout, child.stderr[-3000:]
    records = _records(trail)
    assert any(r["type"] == "release" for r in records), "the served request's release is in the trail"
    status, out, err = audit_tool("verify", "--pubkey", str(pub), str(trail))
    assert status == 0 and out.startswith("OK"), (
        f"the trail of a server that served one request and exited does not verify (exit {status}): {out.strip()}")


def test_a_restarted_server_never_takes_a_boot_number_whose_later_files_remain(jvm, tmp_path, monkeypatch):
    """Promise (bridge README, KVSHIELD_AUDIT_DIR: "a restarted server's [trail lands] beside the earlier ones (`B`:
    the first boot number unused there)"; RotatingFileSink: "Files are created new (never appended to or
    overwritten)"). SlotAllocator.attachAudit takes boot B as unused when `...-boot<B>-000001.jsonl` is absent
    (AuditSink.holdsTrail looks at file 1 only). A long trail rotates into -000002, -000003, ...; when the
    operator's log retention removes the oldest file (-000001), boot 1 still has files there, yet the next
    server start takes boot 1 again: its new trail's files carry the same prefix as the old boot's remaining
    ones, so `audit verify` of "boot 1" (the README's `...-boot<B>*` files) fails as spliced, and when the new
    trail rotates (256 MiB) its CREATE_NEW of -000002 hits the old file: the sink fails and a COMPLIANCE pool
    halts every hand-out in the middle of serving. Severity: low-medium (a routine retention policy turns into
    a later serving outage and an unverifiable boot)."""
    import os
    import subprocess
    import sys

    trail, pub = _compliance(tmp_path, monkeypatch)
    tests = os.path.dirname(os.path.abspath(__file__))

    def server():  # one server process's life (a restart is a new process: pools and boots counted afresh)
        child = subprocess.run([sys.executable, "-c", _SERVER_THAT_EXITS, tests], env=dict(os.environ), capture_output=True,
                               text=True, timeout=300)
        assert child.returncode == 0 and "SERVED" in child.stdout, child.stderr[-3000:]

    server()
    (old,) = sorted(trail.glob("*.jsonl"))  # NOTE: beside it, the pool and rank's lock file
    assert old.name.endswith("-boot1-000001.jsonl"), old.name
    # The old boot's trail as retention leaves it: its later file kept, its first file removed.
    old.rename(old.with_name(old.name.replace("-000001.jsonl", "-000002.jsonl")))
    kept = {p.name for p in trail.iterdir()}
    server()  # the server restarted
    created = sorted({p.name for p in trail.iterdir()} - kept)
    boots_kept = {n.rsplit("-", 1)[0] for n in kept}
    clash = [n for n in created if n.rsplit("-", 1)[0] in boots_kept]
    boot1 = sorted(str(p) for p in trail.iterdir() if "-boot1-" in p.name)
    status, out, _ = audit_tool("verify", "--pubkey", str(pub), *boot1)
    assert not clash, (f"the restarted server's trail {created} took the boot number of the files {sorted(kept)} still in the"
                       f" directory; verify of that boot's files now says: {out.strip().splitlines()[0]}")


def _forge_without(trail, key_file, drop):
    """What anyone holding the server's signing key file can do: rewrite the trail without the records ``drop``
    selects, renumber and re-chain every record and re-sign every checkpoint with that key."""
    import hashlib
    import re

    import jpype

    key = jpype.JClass("dev.kvshield.audit.AuditKeys").loadSigningKey(jpype.JClass("java.nio.file.Path").of(str(key_file)))
    chain = jpype.JClass("dev.kvshield.audit.internal.RecordChain")
    b64 = jpype.JClass("java.util.Base64").getEncoder()
    for f in sorted(trail.iterdir()):
        out, seq, prev = [], 0, "0" * 64
        for line in f.read_text().splitlines():
            if not line or drop(json.loads(line)):
                continue
            body = line[:line.rindex(',"hash":"')]
            body = re.sub(r'^\{"seq":\d+,"prev":"[0-9a-f]{64}"', '{"seq":%d,"prev":"%s"' % (seq, prev), body)
            if '"type":"checkpoint"' in body:
                body = re.sub(r'"upTo":-?\d+', '"upTo":%d' % (seq - 1), body)
                body = re.sub(r'"head":"[0-9a-f]{64}"', '"head":"%s"' % prev, body)
                signed = body[:body.rindex(',"sig":"')]
                sig = str(b64.encodeToString(key.sign(chain.checkpointMessage(jpype.JArray(jpype.JByte)(signed.encode())))))
                body = signed + ',"sig":"' + sig + '"'
            h = hashlib.sha256(body.encode()).hexdigest()
            out.append(body + ',"hash":"' + h + '"}')
            seq, prev = seq + 1, h
        f.write_text("\n".join(out) + "\n")


def test_a_bridge_trail_ships_its_checkpoints_off_the_host(jvm, tmp_path, monkeypatch, capfd):
    """Promise (README "Compliance mode and the audit trail": a signed checkpoint "every 10,000 records and at
    close is also shipped off the host", and only `--shipped` catches "a log rewritten after a checkpoint left
    the host"; bridge README: COMPLIANCE through the bridge writes "the signed audit trail"). The signing key
    must sit on the serving host (KVSHIELD_AUDIT_SIGNING_KEY, read by the server), so the trail alone proves
    nothing against that host: here the records of two refused cross-tenant frees (`reject_foreign`, the
    evidence that globex presented acme's pages) are deleted and the trail re-chained and re-signed with the
    server's own key file, and `audit verify` says OK. Shipping is what defeats this, and the bridge never
    ships: SlotAllocator.attachAudit builds its AuditConfig with a sink and a key only (no CheckpointShipper,
    not even CheckpointShipper.logLine()), and no bridge setting names a collector. So no checkpoint of a
    bridge trail ever leaves the trail's directory (none in the server's output either), and every
    COMPLIANCE trail written through SGLang can be rewritten undetectably by whoever runs the server.
    Severity: high (tamper evidence of the bridge's audit trail is void against the host it runs on)."""
    trail, _ = _compliance(tmp_path, monkeypatch)
    key, pub = signing_keys(tmp_path)
    a = _allocator(level="COMPLIANCE")
    a.set_plan([("r1", "acme", 0, 8)])
    slots = a.alloc(8)
    a.clear_plan()
    with a.releasing("globex", "r2"):
        a.free(slots)  # refused: acme's pages, presented by another tenant's request
    with a.releasing("acme", "r1"):
        a.free(slots)
    a.end_step()
    a.close()
    assert any(r["type"] == "reject_foreign" for r in _records(trail))
    checkpoint = [r for r in _records(trail) if r["type"] == "checkpoint"][-1]
    logged = capfd.readouterr()
    _forge_without(trail, key, lambda r: r["type"] == "reject_foreign")
    assert not any(r["type"] == "reject_foreign" for r in _records(trail))
    status, out, _ = audit_tool("verify", "--pubkey", str(pub), str(trail))
    assert status == 0 and out.startswith("OK"), "the forgery itself is sound: " + out
    shipped_anywhere = checkpoint["sig"] in logged.out + logged.err or any(
        checkpoint["sig"] in p.read_text(errors="replace") for p in tmp_path.rglob("*") if p.is_file() and trail not in p.parents)
    assert shipped_anywhere, ("a trail with the cross-tenant refusals deleted verifies OK with the server's key, and the bridge"
                              f" shipped no checkpoint anywhere that could refute it: {out.strip()}")


def test_compliance_with_an_empty_audit_directory_refuses_naming_it(jvm, tmp_path, monkeypatch):
    """README/BridgeSettings: COMPLIANCE writes its signed audit trail to the configured directory or refuses to
    start naming the setting; bad settings fail closed naming the value. An empty ``auditDir`` names no
    directory (the environment path already drops an empty KVSHIELD_AUDIT_DIR as unset, and COMPLIANCE then
    refuses): handed to the allocator's settings it must be refused too, not read as the process's working
    directory, where the compliance trail would silently land."""
    import torch

    from coverage_world import audit_keys
    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import KvShieldError

    key, _, _ = audit_keys()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    opened = None
    try:
        with pytest.raises(KvShieldError, match="auditDir"):
            opened = PagedTokenToKVPoolAllocator(
                32, 4, torch.float32, "cpu", MHAPool(32, 4), False,
                kvshield_settings={"level": "COMPLIANCE", "advertisedContextTokens": 32, "auditSigningKey": key,
                                   "auditDir": ""})
    finally:
        written = sorted(os.listdir(cwd))
    assert opened is None
    assert written == [], f"the COMPLIANCE trail went to the working directory: {written}"


@pytest.mark.parametrize("twin", [False, True])
def test_a_requests_summary_is_recorded_before_its_deferred_release_reaches_the_pool(jvm, tmp_path, monkeypatch, twin):
    """Promise (SlotAllocator.requestFinished / AuditTrail.requestFinished: "call once, after the request's last release
    ... after its last page event"; bridge README: "each finished request's summary"; allocator.request_finished: "ended
    after its last release").
    What happens: plugin.release_kv_cache calls ``alloc.request_finished`` right after the ``releasing`` context, and
    request_finished crosses to Java at once (``self._call``), not through ``_run_or_defer``. On a GPU every free of a
    request's device slots (and its end and leftovers) is deferred to ``resolve_frees`` (the next step boundary), so
    the signed trail records the request's summary while the request still holds all its pages, and its free/release
    records come after its summary (a request that "completed" and then released pages), and whatever its release finds is
    missing from its summary: here its refused stale free is in the trail, yet its summary says ``rejections: 0``
    (a failed zero-verification at release would be missed the same way). Shown here with SGLang-shaped device index tensors
    (tests.fakes.DeviceOnlyTensor), the exact sequence the hook runs.
    Severity: medium (the audit record of a request is wrong about its own life; COMPLIANCE relies on it).
    Cause: allocator.py:_KvShieldMixin.request_finished (immediate crossing) called from
    plugin.py:_install_release.release_kv_cache."""
    from fakes import DeviceOnlyTensor, install_fake_cuda
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    def served(device, name):
        """One request through the bridge's release as the hook runs it (a stale second free of its first page
        refused); returns its pool id."""
        a = PagedTokenToKVPoolAllocator(16, 4, torch.float32, "cpu", MHAPool(16, 4), False,
                                        kvshield_settings=dict(level="COMPLIANCE", advertisedContextTokens=16))
        req = NamedRequest(name)
        a.set_plan([(req, "acme", 0, 8)])
        slots = a.alloc(8)
        a.clear_plan()
        with a.releasing("acme", req, leftovers=True):  # plugin.release_kv_cache: SGLang's release inside
            a.free(device(slots))
            a.free(device(slots[:4]))
        a.request_finished(req, "acme", False, req.rid)  # what the hook does next
        rid = a.request_id(req)
        a.end_step()
        a.close()
        return rid

    # control: host index tensors (nothing deferred): the summary counts the refused free
    _compliance(tmp_path, monkeypatch)
    monkeypatch.setenv("KVSHIELD_AUDIT_DIR", str(tmp_path / "control"))
    served(lambda t: t, "rid-1")
    control = [r for r in _records(tmp_path / "control") if r["type"] == "summary"]
    assert [r["rejections"] for r in control] == [1], control

    install_fake_cuda(monkeypatch)
    trail, _ = _compliance(tmp_path, monkeypatch)
    if twin:  # planted bug: the end is recorded at once, ahead of the release's deferred operations
        monkeypatch.setattr(PagedTokenToKVPoolAllocator, "request_finished", lambda self, req, tenant, aborted, label:
                            self._call(self._j.requestFinished, self.tenant_id(tenant), self._known_request_id(req),
                                       aborted, label))
    rid = served(lambda t: DeviceOnlyTensor(t.tolist()), "gpu-rid-1")  # its row's device slots, as on a GPU
    records = _records(trail)
    summary_at = [i for i, r in enumerate(records) if r["type"] == "summary" and r.get("req") == rid]
    release_at = [i for i, r in enumerate(records) if r["type"] in ("release", "free") and r.get("req") == rid]
    assert summary_at and release_at, (summary_at, release_at, records)
    summary = records[summary_at[0]]
    refused = [r for r in records if r["type"].startswith("reject") and r.get("req") == rid]
    assert refused, records
    if twin:
        assert summary["rejections"] == 0 and summary_at[0] < max(release_at), (summary, summary_at, release_at)
        return
    assert summary["rejections"] == len(refused), (
        f"request {rid}'s summary says rejections={summary['rejections']}, the trail holds {len(refused)} refused"
        f" free(s) of it, recorded after its summary")
    assert summary_at[0] > max(release_at), (
        f"request {rid} was summarised before its release: its summary is record {summary_at[0]}, its release records"
        f" {release_at} come after it")


_PLANT_ENDS = r'''
import os
from kvshield_sglang import allocator as _allocator
if os.environ.get("PLANTED") == "ends-at-release":  # planted bug: an end decided at the release, a session's outside any
    def _at_release(self, req, tenant, outcome):      # request's release only (as before the fix)
        ended = outcome(req)
        if ended is not None:
            self.request_finished(req, tenant, ended, req.rid)
    _allocator._KvShieldMixin.request_released = _at_release
    _inner = _allocator._KvShieldMixin.request_finished
    def _outside_only(self, req, tenant, aborted, label):
        if not (isinstance(label, str) and label.startswith("session:") and self._releasing_request >= 0):
            _inner(self, req, tenant, aborted, label)
    _allocator._KvShieldMixin.request_finished = _outside_only
'''


_SESSIONS_AUDITED = _PLANT_ENDS + r'''
import json
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
with servers.single_rank():
    w = session_world.World("unified", 4)
    a = w.alloc
    w.open("s-closed", "acme")                  # control: a turn, then the session's close
    w.turn("s-closed", range(1, 8))
    w.close("s-closed")
    w.open("s-aborted", "globex")               # a turn, a mid-turn abort (release_session inside the release), close
    w.turn("s-aborted", range(500, 503))
    w.turn("s-aborted", [590, 591], abort=True)
    w.close("s-aborted")
    w.open("s-first-aborted", "globex")         # its first turn aborted mid-turn (SGLang builds the slot it releases)
    w.turn("s-first-aborted", range(600, 605), abort=True)
    w.close("s-first-aborted")
    w.open("s-deferred", "acme")                # a turn, then a close while the next turn runs (deferred to its end)
    w.turn("s-deferred", range(20, 25))
    held = {n: a.request_id(w.sessions[n].session) for n in ("s-closed", "s-aborted", "s-first-aborted", "s-deferred")}
    w.live_turn_refuses_others("s-deferred")
    w.plain("acme")
    a.end_step()
    held.update(acme=a.tenant_id("acme"), globex=a.tenant_id("globex"))
    print("IDS " + json.dumps(held), flush=True)
'''


@pytest.mark.parametrize("planted", ["", "ends-at-release"])
def test_a_streaming_session_ended_by_a_mid_turn_abort_or_a_deferred_close_is_never_summarised(jvm, tmp_path,
                                                                                                monkeypatch, planted):
    """Promise (bridge README: "each finished request's summary ... a streaming session's carries session:<id>";
    AuditTrail: one summary per finished request, so `audit request` shows how each holder ended).
    What happens: plugin.release_session writes the session's summary only on its outside-any-request path. A session's
    KV released from inside its turn's release (``alloc._releasing_request >= 0``) skips it: SGLang's mid-turn abort
    (``try_cache_finished_req`` -> ``release_session``) and kvshield's own deferred close (a close while a turn runs,
    run from ``try_cache_finished_req`` at the turn's end). The turn's own release skips summaries for streaming
    turns ("at its release"), and the later close finds no slot (``kvshield_session`` gone), so no summary is ever
    written for that session holder, though all its pages were allocated, read and released under it. Driven on
    SGLang's UnifiedRadixCache/StreamingSession (tests/session_world.py); the control session (turn, close) gets one.
    Later (round on sessions): a first turn's mid-turn abort too: SGLang builds the slot it releases inside the
    release, with no session named on it, so the hook released it unnamed and wrote no summary.
    Severity: low-medium (audit completeness: under COMPLIANCE two ordinary session endings leave no summary).
    Cause: plugin.py:_install_streaming_sessions.release_session (the ``_releasing_request >= 0`` branch) with
    plugin.py:_install_release.release_kv_cache (``not _streaming(req)``)."""
    trail, _ = _compliance(tmp_path, monkeypatch)
    ids = scenarios.run_reporting(_SESSIONS_AUDITED, "IDS ", tmp_path, TEST_CLASSES, KVSHIELD_LEVEL="COMPLIANCE",
                                  KVSHIELD_ALLOW_UNFIXED_HANDOFF="1", PLANTED=planted)
    records = _records(trail)
    summarised = {r["req"] for r in records if r["type"] == "summary"}
    used = {r.get("req") for r in records if r["type"] != "summary"}
    assert ids["s-closed"] in summarised, ("control: a closed session is summarised", ids, sorted(summarised))
    ended = ("s-aborted", "s-first-aborted", "s-deferred")
    missing = {n: ids[n] for n in ended if ids[n] not in summarised}
    if planted:
        assert missing == {n: ids[n] for n in ended}, (missing, ids)
        return
    assert not missing, (f"sessions {missing} held and released pages (their pool ids appear in"
                         f" {sorted(set(missing.values()) & used)} of the trail's records) but have no summary;"
                         f" summaries: {sorted(summarised)}")


_PREFILL_AUDITED = _PLANT_ENDS + r'''
import json, os
from kvshield_sglang import plugin
import prefill_world
from prefill_world import KVPoll, disagg_prefill
plugin.load()
import servers
servers.one_process_group()
with servers.single_rank():
    servers.publish_server_args(attention_backend="torch_native")
    os.environ[disagg_prefill.SEND_TIMEOUT] = "60"
    s = prefill_world.Scheduler()
    ok = s.request("prefill-ok", 12)                  # control: its transfer succeeds
    s.prefill(ok, 100.0)
    ok.disagg_kv_sender.state = KVPoll.Success
    s.process_disagg_prefill_inflight_queue()
    s.step()
    bad = s.request("prefill-transfer-failed", 12, tenant="t2")   # its transfer fails (the decode side went away)
    s.prefill(bad, 200.0)
    bad.disagg_kv_sender.state = KVPoll.Failed
    s.process_disagg_prefill_inflight_queue()
    s.step()
    out = {"ok": s.alloc.request_id(ok), "bad": s.alloc.request_id(bad), "bad_finished": bad.finished(),
           "bad_reason": type(bad.finished_reason).__name__, "available": s.alloc.available_size(),
           "size": prefill_world.SIZE}
    print("IDS " + json.dumps(out), flush=True)
'''


@pytest.mark.parametrize("planted", ["", "ends-at-release"])
def test_a_prefill_request_whose_kv_transfer_failed_is_never_summarised(jvm, tmp_path, monkeypatch, planted):
    """Promise (bridge README: "each finished request's summary (written at the next step boundary) carries its rid";
    AuditTrail.requestFinished: one summary per request, with its outcome; the summary's earlier fix: "each finished request ...
    summarised through SGLang's release").
    What happens: the hook in ``release_kv_cache`` summarises only a request that is ``finished()`` when released.
    SGLang's PD prefill releases a request whose KV transfer failed (``process_disagg_prefill_inflight_queue`` ->
    transfer-failure handling) and only then ``prepare_abort``s it; its bootstrap failure
    (``handle_bootstrap_failure``) does the same, and a decode server's abort of a queued request releases its
    preallocated KV without finishing it. The request is aborted to its client and never released again, so the signed
    trail shows its pages allocated and released and no summary at all: the failed transfers, the very requests an
    operator audits, are the ones missing. Driven through SGLang's own prefill mixin (tests/prefill_world.py); the
    successful transfer beside it is summarised.
    Severity: low-medium (audit completeness; every failed PD transfer lacks its summary).
    Cause: plugin.py:_install_release.release_kv_cache (``req.finished()`` checked at release time; SGLang finishes
    these requests after their last release)."""
    trail, _ = _compliance(tmp_path, monkeypatch)
    ids = scenarios.run_reporting(_PREFILL_AUDITED, "IDS ", tmp_path, TEST_CLASSES, PLANTED=planted)
    records = _records(trail)
    summarised = {r["req"] for r in records if r["type"] == "summary"}
    used = {r.get("req") for r in records if r["type"] != "summary"}
    assert ids["ok"] in summarised, ("control: the successful transfer is summarised", ids, sorted(summarised))
    assert ids["bad_finished"] and ids["bad"] in used, ids
    if planted:
        assert ids["bad"] not in summarised, (ids, sorted(summarised))
        return
    assert ids["bad"] in summarised, (
        f"request {ids['bad']} (rid prefill-transfer-failed, {ids['bad_reason']}) held and released pages but has no"
        f" summary; summaries: {sorted(summarised)}")
