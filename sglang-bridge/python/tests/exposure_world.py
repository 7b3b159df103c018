"""`audit exposure` over the trail of a scheduler on the real SGLang (:mod:`scheduler_world`), against the KV bytes.

Two tenants' requests run through SGLang's scheduler loop (prefix hits within a tenant, chunked prefill, eviction and
retraction under memory pressure) with kvshield's allocator and its signed trail. Before each forward the driver reads
every page newly handed to a request (the page of each of its fresh slots at a page start), whole, and counts the
slots holding another tenant's pattern: the ground truth of what each request received. `audit exposure --pubkey`
over the closed trail must name exactly those requests (by their rid), with those tenants and slot counts, and the
answer must stand on a verified trail. ``main`` prints ``RESULTS <json>``: scenario -> [pass|fail|error, message].
"""

import json
import os

import torch

import scheduler_world as sw

PAGE = 4


def _received(world):
    """Wraps the oracle's pre-forward check: also records, per rid, what the pages newly handed to it held."""
    truth = {}
    fresh = world.oracle.fresh

    def recording(batch):
        slots = batch.out_cache_loc.as_subclass(torch.Tensor).to(torch.int64).tolist()
        counts = [1] * len(batch.reqs) if batch.forward_mode.is_decode() else list(batch.extend_lens)
        at = 0
        for req, n in zip(batch.reqs, counts):
            t = world.track_of(req)
            for s in slots[at:at + n]:
                if s % PAGE:
                    continue
                held = world.kv.k_buffer[0][s:s + PAGE, 0, 0].to(torch.int64).tolist()
                foreign = [sw.TENANTS[c - 1] for c in held if c in (1, 2) and c != t.code]
                if foreign:
                    tenant, sources, count = truth.get(req.rid, (t.tenant, set(), 0))
                    truth[req.rid] = (tenant, sources | set(foreign), count + len(foreign))
            at += n
        return fresh(batch)

    world.oracle.fresh = recording
    return truth


def _named(trail, pub):
    """What `audit exposure --json --pubkey` names over ``trail``: rid -> (tenant, sources, slots); and its verdict."""
    import io

    import jpype

    out, err = io.StringIO(), io.StringIO()
    baos, ps = jpype.JClass("java.io.ByteArrayOutputStream"), jpype.JClass("java.io.PrintStream")
    utf8 = jpype.JClass("java.nio.charset.StandardCharsets").UTF_8
    o, e = baos(), baos()
    status = int(jpype.JClass("dev.kvshield.audit.AuditTool").run(
        jpype.JArray(jpype.JString)(["exposure", "--json", "--pubkey", str(pub), str(trail)]), ps(o, True, utf8),
        ps(e, True, utf8)))
    out.write(str(o.toString(utf8)))
    err.write(str(e.toString(utf8)))
    doc = json.loads(out.getvalue())
    named = {x["label"]: (x["tenant"], sorted(x["sourceTenants"]), x["foreignSlotsReceived"]) for x in doc["exposed"]}
    return status, doc["verified"], named, err.getvalue()


def _run(level, tmp):
    import jpype

    keys = os.path.join(tmp, f"keys-{level}")
    os.makedirs(keys)
    jpype.JClass("dev.kvshield.audit.AuditKeys").generate(jpype.JClass("java.nio.file.Path").of(keys))
    trail = os.path.join(tmp, f"trail-{level}")
    os.environ.update(KVSHIELD_AUDIT_SIGNING_KEY=os.path.join(keys, "audit-signing.key"), KVSHIELD_AUDIT_DIR=trail,
                      KVSHIELD_ROOT_KEY="ephemeral" if level == "ENCRYPT" else "")
    w = sw.World(sw.Config("kvshield", "radix", PAGE, level=level, size=96, rows=8))
    truth = _received(w)
    o = sw.run(w, sw.Workload(n=40, new_tokens=(16, 48), abort_fraction=0))
    w.alloc.close()
    status, verified, named, err = _named(trail, os.path.join(keys, "audit-signing.pub"))
    expected = {rid: (tenant, sorted(sources), count) for rid, (tenant, sources, count) in truth.items()}
    return o, status, verified, named, expected, err


def check(level, tmp):
    o, status, verified, named, expected, err = _run(level, tmp)
    assert o.finished == o.total and o.retractions > 0 and o.prefix_hits > 0, \
        f"the workload must finish, retract and hit prefixes: {o.row()}"
    assert status == 0 and verified, f"exposure did not stand on a verified trail: {status} {err[-500:]}"
    assert (len(expected) > 0) == (level == "NONE"), f"ground truth at {level}: {expected}"
    assert named == expected, f"{level}: exposure named {named}, the bytes say {expected}"
    return f"{len(expected)} requests received another tenant's slots; {o.retractions} retractions"


def main():
    import tempfile

    import servers
    import wire
    from kvshield_sglang import plugin, runtime

    plugin.load()
    wire.install()
    servers.one_process_group()
    runtime.ensure_jvm()
    results = {}
    tmp = tempfile.mkdtemp()
    for level in os.environ.get("EXPOSURE_WORLD_LEVELS", "NONE,ZERO,ENCRYPT").split(","):
        try:
            results[level] = ["pass", check(level, tmp)]
        except AssertionError as e:
            results[level] = ["fail", f"AssertionError: {e}"]
        except Exception as e:  # noqa: BLE001 (reported to the test, which names the level)
            import traceback

            results[level] = ["error", "".join(traceback.format_exception(e))[-2000:]]
    print("RESULTS " + json.dumps(results))
