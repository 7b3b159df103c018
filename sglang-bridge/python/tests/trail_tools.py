"""What the audit-trail tests share: a signing key pair, one request served through the bridge, the ``./kvshield
audit`` command run in this JVM, and a request object."""


def signing_keys(tmp_path):
    """The audit key pair under ``tmp_path/keys`` (generated once): (signing key path, public key path)."""
    import jpype

    keys = tmp_path / "keys"
    keys.mkdir(exist_ok=True)
    if not (keys / "audit-signing.key").exists():
        jpype.JClass("dev.kvshield.audit.AuditKeys").generate(jpype.JClass("java.nio.file.Path").of(str(keys)))
    return keys / "audit-signing.key", keys / "audit-signing.pub"


def serve_one(a, req, tenant):
    """One request's life through the bridge: planned, allocated 8 slots, released by its own release."""
    a.set_plan([(req, tenant, 0, 8)])
    slots = a.alloc(8)
    a.clear_plan()
    with a.releasing(tenant, req):
        a.free(slots)
    a.end_step()
    return slots


def audit_tool(*args):
    """Runs ``./kvshield audit ARGS`` in this JVM: (exit status, stdout, stderr)."""
    import jpype

    baos = jpype.JClass("java.io.ByteArrayOutputStream")
    ps = jpype.JClass("java.io.PrintStream")
    utf8 = jpype.JClass("java.nio.charset.StandardCharsets").UTF_8
    out, err = baos(), baos()
    status = int(jpype.JClass("dev.kvshield.audit.AuditTool").run(
        jpype.JArray(jpype.JString)([str(a) for a in args]), ps(out, True, utf8), ps(err, True, utf8)))
    return status, str(out.toString(utf8)), str(err.toString(utf8))


class NamedRequest:
    """What the bridge needs of SGLang's ``Req``: an object (its identity) with the client's ``rid``."""

    def __init__(self, rid):
        self.rid = rid
