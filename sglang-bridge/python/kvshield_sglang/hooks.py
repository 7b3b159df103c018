"""Every SGLang target kvshield hooks, found by name and checked by signature before it is wrapped, and
the per-process record of what was installed.

A hook whose target is missing, or whose signature is not the one the wrapper was written against, is not
installed and is recorded as failed with the reason (:func:`failed`). The rank report each scheduler
process writes when its allocator is built (:mod:`kvshield_sglang.ranks`) carries every hook's outcome,
and a rank with a failed hook reports itself not protected: the every-rank gate then refuses to serve,
naming the rank and the hook. The process's own ranks (tensor, data and pipeline parallel) come from the
arguments SGLang passes ``Scheduler.__init__`` (:func:`rank_identity`).
"""

import importlib
import inspect
import logging
import os

logger = logging.getLogger(__name__)

# hook name -> "ok" or the reason it is not installed, in install order.
_RESULTS = {}
_IDENTITY = {}
# (hook name, owner, attribute, what the hook bound there): checked again later (displaced), as another plug-in's
# hooks (SGLang's HookRegistry applies them after every plug-in ran) may replace a wrapper after it went in.
_BOUND = []
_CURRENT = []


class HookError(Exception):
    """A target is missing or does not have the signature a wrapper needs; the message names both."""


def lookup(module, qualname):
    """The object at ``module``'s ``qualname`` (dotted inside the module); raises HookError naming what is missing."""
    try:
        obj = importlib.import_module(module)
    except ImportError as e:
        raise HookError(f"module {module} does not import ({e})") from None
    for part in qualname.split("."):
        if not hasattr(obj, part):
            raise HookError(f"{module}.{qualname} does not exist")
        obj = getattr(obj, part)
    return obj


def expect(fn, where, positional=(), keyword=()):
    """Raises HookError unless ``fn``'s leading parameters are named ``positional`` (in order) and it
    accepts each of ``keyword`` by name: the wrapper passes them so, or reads them from the call."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise HookError(f"{where} has no inspectable signature ({e})") from None
    names = [p.name for p in params]
    lead = [p.name for p in params[:len(positional)]
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_any = any(p.kind == p.VAR_KEYWORD for p in params)
    missing = [k for k in keyword if k not in names and not takes_any]
    if lead != list(positional) or missing:
        raise HookError(f"{where}{inspect.signature(fn)} does not match what kvshield wraps: needs leading parameters "
                        f"({', '.join(positional)})" + (f" and keyword {', '.join(keyword)}" if keyword else ""))
    return fn


def install(name, fn):
    """Runs ``fn()`` (which finds, checks and wraps one hook) and records the outcome under ``name``:
    a HookError (or any exception, e.g. a policy refusal) is logged loudly and recorded, never raised,
    so one hook's failure never leaves later hooks unattempted. Returns whether it was installed."""
    _CURRENT.append(name)
    try:
        fn()
    except Exception as e:  # noqa: BLE001  (recorded: the rank then refuses to serve, naming it)
        _RESULTS[name] = f"{type(e).__name__}: {e}"
        logger.error("kvshield: hook %s not installed: %s", name, _RESULTS[name])
        return False
    finally:
        _CURRENT.pop()
    _RESULTS[name] = "ok"
    return True


def bound(owner, attribute, value):
    """Notes that the hook being installed bound ``value`` at ``owner.attribute`` (see :func:`displaced`)."""
    if _CURRENT:
        _BOUND.append((_CURRENT[-1], owner, attribute, value))


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _still_ours(current, value):
    # NOTE: kvshield's own later wrapper of the same name (its code is this package's: functools.wraps copies a
    # marker, a name and a module, never the code) or a subclass of our class keep the hook in place. Another
    # plug-in's wrapper does not: SGLang's HookRegistry wraps a REPLACE exactly as an AROUND (ours as __wrapped__),
    # so whether ours still runs cannot be told
    code = getattr(current, "__code__", None)
    return (current is value or code is not None and os.path.abspath(code.co_filename).startswith(_PACKAGE_DIR)
            or isinstance(value, type) and isinstance(current, type) and issubclass(current, value))


def displaced():
    """["name: where: replaced by what", ...]: hooks whose wrapper something replaced after it was installed."""
    out = []
    for name, owner, attribute, value in _BOUND:
        current = getattr(owner, attribute, None)
        if not _still_ours(current, value):
            where = f"{getattr(owner, '__name__', type(owner).__name__)}.{attribute}"
            source = getattr(getattr(current, "__code__", None), "co_filename", "?")
            out.append(f"{name}: {where} was replaced or wrapped after kvshield installed its hook (now {current!r} of"
                       f" {source})")
    return out


def attempt(name, fn):
    """``fn()``, or None when it raises: then recorded under ``name`` as a failed hook (the rank refuses to serve,
    naming it), never raised. For the settings every hook needs (a success records nothing)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001  (recorded: the rank then refuses to serve, naming it)
        _RESULTS[name] = f"{type(e).__name__}: {e}"
        logger.error("kvshield: %s failed: %s", name, _RESULTS[name])
        return None


def results():
    """{hook name: "ok" or why it is not installed (or no longer in place)} for this process."""
    out = dict(_RESULTS)
    for entry in displaced():
        name, why = entry.split(": ", 1)
        out[name] = why
    return out


def failed():
    """["name: reason", ...] of the hooks not installed, or no longer in place, in this process."""
    return [f"{n}: {r}" for n, r in _RESULTS.items() if r != "ok"] + displaced()


def loaded():
    """Whether the plug-in tried to install anything in this process."""
    return bool(_RESULTS)


def set_scheduler_ranks(tp_rank, dp_rank, pp_rank, server=None):
    """Records the ranks SGLang gave this process's scheduler (one scheduler per process) and the server it serves
    (``ranks.server_of``)."""
    _IDENTITY.update(tp=int(tp_rank), dp=0 if dp_rank is None else int(dp_rank), pp=int(pp_rank), server=server)


def scheduler_server():
    """The server this process's scheduler serves (``ranks.server_of``), None outside a scheduler or unknown."""
    return _IDENTITY.get("server")


def rank_identity():
    """(tp, dp, pp) of this scheduler process: the ranks SGLang passed its Scheduler (the data-parallel rank
    as SGLang resolves it: its argument, else ``SGLANG_DP_RANK``), else (0, 0, 0) outside a scheduler."""
    if _IDENTITY:
        return _IDENTITY["tp"], _IDENTITY["dp"], _IDENTITY["pp"]
    return 0, int(os.environ.get("SGLANG_DP_RANK", "0")), 0
