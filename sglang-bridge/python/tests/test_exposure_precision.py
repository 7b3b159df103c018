"""`audit exposure` over a bridge trail, against ground truth read from the KV bytes. A bridge trail holds no reads, so
the query judges each hand-out as a read (design note 54): it must name exactly the requests handed pages that still held
another tenant's bytes, with those tenants and that many slots, and no request handed zeros or ciphertext. The ground
truth: each request's forward writes a value naming its tenant into the slots it was given; at a hand-out the test reads
every slot of the pages handed out, before the new owner writes, and counts the slots holding another tenant's value."""

import json

import pytest

from conftest import TEST_SEALER, require_module
from fakes import MHAPool
from trail_tools import NamedRequest, audit_tool, signing_keys

torch = require_module("torch")
PAGE = 4
TAGS = {"acme": 1001.0, "globex": 2002.0, "filler": 3003.0}


class Served:
    """An allocator with a trail at ``level``, and what each hand-out found in its pages, by the bytes."""

    def __init__(self, level, tmp_path):
        from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

        self.key, self.pub = signing_keys(tmp_path)
        self.trail = tmp_path / "trail"
        self.kv = MHAPool(32, PAGE, layers=2)
        self.a = PagedTokenToKVPoolAllocator(32, PAGE, torch.float32, "cpu", self.kv, False, kvshield_settings=dict(
            level=level, advertisedContextTokens=32, sealerFactory=TEST_SEALER, auditSigningKey=str(self.key),
            auditDir=str(self.trail)))
        self.truth = {}

    def serve(self, tenant, rid, tokens):
        """Hands ``tokens`` slots to a new request, notes what its pages held, and writes its KV (the forward)."""
        req = NamedRequest(rid)
        self.a.begin_step()
        self.a.set_plan([(req, tenant, 0, tokens)])
        n = torch.tensor([tokens])
        slots = self.a.alloc_extend(torch.tensor([0]), torch.tensor([0]), n, n, torch.tensor([-1]), tokens)
        self.a.clear_plan()
        assert slots is not None
        pages = sorted({int(s) // PAGE for s in slots.tolist()})
        whole = torch.tensor([p * PAGE + i for p in pages for i in range(PAGE)])
        held = self.kv.read(whole)  # (buffers, slots, heads, dim)
        sources, count = set(), 0
        for i in range(len(whole)):
            found = {name for name, tag in TAGS.items() if name != tenant and bool((held[:, i] == tag).any())}
            sources |= found
            count += 1 if found else 0
        if count:
            self.truth[rid] = (tenant, sorted(sources), count)
        for buf in self.kv.buffers():
            buf[slots] = TAGS[tenant]
        return req, slots

    def finish(self, tenant, req, slots):
        with self.a.releasing(tenant, req):
            self.a.free(slots)
        self.a.request_finished(req, tenant, False, req.rid)  # NOTE: what the bridge's hook on SGLang's release records
        self.a.end_step()

    def named(self):
        """What `audit exposure --pubkey` names, keyed by the request's label (its rid); the answer must be verified."""
        self.a.close()
        status, out, err = audit_tool("exposure", "--json", "--pubkey", str(self.pub), str(self.trail))
        doc = json.loads(out)
        assert status == 0 and doc["verified"], err
        return {e["label"] or e["outcome"]: (e["tenant"], e["sourceTenants"], e["foreignSlotsReceived"]) for e in doc["exposed"]}


def _acme_then_globex(level, tmp_path):
    """Acme's request writes 6 slots (a page and a half) and releases; filler holds every other page, so globex's
    request is handed acme's two pages next."""
    s = Served(level, tmp_path)
    acme = s.serve("acme", "acme-1", 6)
    s.serve("filler", "filler-1", 24)
    s.finish("acme", *acme)
    globex = s.serve("globex", "globex-1", 8)
    assert sorted({int(x) // PAGE for x in globex[1].tolist()}) == sorted({int(x) // PAGE for x in acme[1].tolist()}), \
        "globex must be handed acme's pages for the test to mean anything"
    s.finish("globex", *globex)
    return s


@pytest.mark.parametrize("level", ["NONE", "ZERO", "ENCRYPT"])
def test_exposure_names_exactly_the_requests_whose_pages_held_another_tenants_bytes(jvm, tmp_path, level):
    """Under NONE globex's request received acme's 6 slots (the bytes say so) and is named with acme and 6; under ZERO
    the pages were zeroed, under ENCRYPT sealed and zeroed at the hand-out: nobody is named. Under ENCRYPT the query
    named globex's request with 6 of acme's slots (the tracker took a sealed page for acme's plaintext)."""
    s = _acme_then_globex(level, tmp_path)
    assert s.truth == ({"globex-1": ("globex", ["acme"], 6)} if level == "NONE" else {}), s.truth
    assert s.named() == s.truth


def test_twin_a_trail_read_without_its_seals_names_the_request_the_bytes_clear(jvm, tmp_path):
    """The planted twin: the same ENCRYPT trail replayed without its `seal` records (the tracker's view before the fix)
    names globex's request, which the bytes clear: the oracle above sees the difference."""
    import jpype

    s = _acme_then_globex("ENCRYPT", tmp_path)
    assert s.truth == {}
    s.a.close()
    Path, List = jpype.JClass("java.nio.file.Path"), jpype.JClass("java.util.List")
    lines = jpype.JClass("dev.kvshield.audit.AuditLog").read(List.of(Path.of(str(s.trail))))
    unsealed = jpype.JClass("java.util.ArrayList")()
    for line in lines:
        if not (line.isRecord() and str(line.type()) == "seal"):
            unsealed.add(line)
    assert unsealed.size() < lines.size()
    report = jpype.JClass("dev.kvshield.audit.ExposureQuery").run(unsealed, jpype.JLong(-2**63), jpype.JLong(2**63 - 1))
    named = {str(e.label()): int(e.foreignSlotsReceived()) for e in report.exposed()}
    assert named == {"globex-1": 6}, named


def test_exposure_over_a_scheduler_trail_names_what_the_bytes_say(jvm, tmp_path):
    """The scheduler on the real SGLang (:mod:`exposure_world`: prefix hits within a tenant, chunked prefill, eviction,
    retraction and re-admission of a request's own KV) at NONE, ZERO and ENCRYPT, and a decode server of a
    prefill/decode split (reservations, transfers of a request's own KV, aborts, decode retraction) at ZERO and
    ENCRYPT: `audit exposure --pubkey` names exactly the requests whose newly handed pages held another tenant's
    bytes, with those tenants and slot counts (some at NONE, none at ZERO and ENCRYPT), on a verified trail."""
    import scenarios
    import scheduler_world as sw
    from conftest import TEST_CLASSES

    results = scenarios.run_world("exposure_world", tmp_path / "ranks", TEST_CLASSES, KVSHIELD_TENANT_HEADER=sw.TENANT_HEADER)
    for name in ("NONE", "ZERO", "ENCRYPT", "pd-ZERO", "pd-ENCRYPT"):
        scenarios.passes(results, name)
