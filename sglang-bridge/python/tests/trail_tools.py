"""What the audit-trail tests share: the ``./kvshield audit`` command run in this JVM, and a request object."""


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
