"""Exceptions the bridge raises; Java's message is kept verbatim."""

from http import HTTPStatus

REQUEST_TOO_LONG = "dev.kvshield.admission.RequestTooLongException"


class KvShieldError(RuntimeError):
    """A kvshield check failed; ``java_class`` names the Java exception when it came from Java."""

    def __init__(self, message, java_class=None):
        super().__init__(message)
        self.java_class = java_class


class JvmStartError(KvShieldError):
    """The JVM could not be started; the message says what was searched."""


class UnsupportedFeatureError(KvShieldError):
    """The engine uses memory kvshield does not protect yet, and the operator did not accept the gap."""


class RankNotProtectedError(KvShieldError):
    """A scheduler rank runs without kvshield; the server must not serve."""


def from_java(exc):
    """Wraps a JPype Java exception into a KvShieldError carrying the Java message."""
    cls = exc.getClass().getName() if hasattr(exc, "getClass") else type(exc).__name__
    msg = exc.getMessage() if hasattr(exc, "getMessage") else str(exc)
    return KvShieldError(f"{cls}: {msg}", java_class=cls)


class HandoffError(KvShieldError):
    """A prefill→decode handoff failed; the client must see an abort with ``status_code``, never a success.

    ``finish_reason`` is SGLang's abort finish reason (``{"type": "abort", ...}``).
    """

    def __init__(self, message, status_code, java_class=None):
        super().__init__(message, java_class)
        self.status_code = status_code
        self.finish_reason = {"type": "abort", "message": message, "status_code": status_code}


def handoff_error(err, status):
    """``err`` (from :func:`from_java`) as a handoff crossing raises it: a request over the effective
    limit is the client's error (400), anything else answers ``status``."""
    code = HTTPStatus.BAD_REQUEST if err.java_class == REQUEST_TOO_LONG else status
    return HandoffError(str(err), int(code), err.java_class)


class RejectedFreeError(KvShieldError, AssertionError):
    """A free the pool rejected (double, stale, foreign, page 0) under SGLang's debug mode
    (``SGLANG_DEBUG_MEMORY_POOL``), where SGLang's own allocator asserts on such frees."""
