"""COMPLIANCE through the bridge: the allocator's pool writes its signed audit trail (``KVSHIELD_AUDIT_SIGNING_KEY``,
``KVSHIELD_AUDIT_DIR``), or the allocator refuses to start naming the missing setting."""

import json

import pytest

from conftest import require_module
from fakes import MHAPool

torch = require_module("torch")


def _keys(tmp_path):
    import jpype

    keys = tmp_path / "keys"
    keys.mkdir()
    jpype.JClass("dev.kvshield.audit.AuditKeys").generate(jpype.JClass("java.nio.file.Path").of(str(keys)))
    return keys / "audit-signing.key", keys / "audit-signing.pub"


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

    key, _ = _keys(tmp_path)
    monkeypatch.delenv("KVSHIELD_AUDIT_SIGNING_KEY", raising=False)
    monkeypatch.delenv("KVSHIELD_AUDIT_DIR", raising=False)
    with pytest.raises(KvShieldError, match="COMPLIANCE writes a signed audit trail; auditSigningKey is not set"):
        _allocator(level="COMPLIANCE")
    monkeypatch.setenv("KVSHIELD_AUDIT_SIGNING_KEY", str(key))
    with pytest.raises(KvShieldError, match="COMPLIANCE writes a signed audit trail; auditDir is not set"):
        _allocator(level="COMPLIANCE")


def _compliance_with_trail(tmp_path, monkeypatch):
    """A COMPLIANCE allocator writing its trail under ``tmp_path``, request r1 of acme holding 8 slots:
    (allocator, slots, trail dir, public key)."""
    key, pub = _keys(tmp_path)
    trail = tmp_path / "trail"
    monkeypatch.setenv("KVSHIELD_AUDIT_SIGNING_KEY", str(key))
    monkeypatch.setenv("KVSHIELD_AUDIT_DIR", str(trail))
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
