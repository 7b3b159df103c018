"""Hooks into SGLang beyond the allocator, each probed by feature (a missing target is logged
loudly and left out; the allocator keeps working):

- **Trusted tenant, end to end.** In the HTTP/tokenizer process, ``TokenizerManager.generate_request``
  (every HTTP entry point passes the FastAPI request to it) resolves the tenant from the request's
  headers (the gateway's tenant header, or the API key in ``Authorization: Bearer`` through the
  server-side map) and every ``TokenizedGenerateReqInput`` built while it runs carries it as
  ``kvshield_tenant`` (set unconditionally, so nothing a client sends survives). In the scheduler,
  every ``Req`` built inside ``Scheduler.handle_generate_request`` takes it from the tokenized request
  it came from. Without a trusted tenant a request goes to the default tenant.
- **Forward launches.** After each ``ModelRunner.forward`` call the allocator's launch fence notes
  the current stream (:mod:`launch_fence`), so GPU protection waits for forwards already launched.
"""

import contextvars
import functools
import inspect
import logging

from .tenants import TenantResolver

logger = logging.getLogger(__name__)
ATTR = "kvshield_tenant"
# The tenant of the HTTP request being tokenized (tokenizer process), or of the tokenized request
# being turned into a Req (scheduler process).
_TENANT = contextvars.ContextVar("kvshield_tenant", default=None)


def _lookup(module, attr):
    import importlib

    try:
        return getattr(importlib.import_module(module), attr, None)
    except ImportError:
        return None


def _missing(what, consequence):
    logger.error("kvshield: this SGLang has no %s; %s", what, consequence)
    return False


def carries_attributes(cls):
    """Whether instances of ``cls`` accept an extra attribute that pickling keeps (no ``__slots__``-only
    layout, as msgspec Structs have)."""
    return cls is not None and any("__dict__" in vars(k) for k in cls.__mro__ if k is not object)


def _stamp_on_init(cls):
    """Every instance of ``cls`` built from now on carries the tenant of the current context (or None)."""
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def init(self, *a, **k):
        orig_init(self, *a, **k)
        setattr(self, ATTR, _TENANT.get())

    cls.__init__ = init


def install_tokenizer_side(tokenizer_manager_cls, tokenized_cls, resolver):
    """Resolves each HTTP request's tenant and stamps it on the tokenized requests built for it."""
    if tokenizer_manager_cls is None or not hasattr(tokenizer_manager_cls, "generate_request"):
        return _missing("TokenizerManager.generate_request", "every request goes to the default tenant")
    if not carries_attributes(tokenized_cls):
        return _missing("TokenizedGenerateReqInput that can carry an extra field (msgspec Struct)",
                        "every request goes to the default tenant")
    if getattr(tokenizer_manager_cls.generate_request, "_kvshield", False):
        return True
    if not inspect.isasyncgenfunction(tokenizer_manager_cls.generate_request):
        return _missing("TokenizerManager.generate_request as an async generator", "every request goes to the default tenant")
    orig_generate = tokenizer_manager_cls.generate_request

    @functools.wraps(orig_generate)
    async def generate_request(self, obj, request=None, *a, **k):
        headers = getattr(request, "headers", None) if request is not None else None
        token = _TENANT.set(resolver.resolve_http(headers) if headers is not None else None)
        try:
            async for out in orig_generate(self, obj, request, *a, **k):
                yield out
        finally:
            try:
                _TENANT.reset(token)
            except (ValueError, RuntimeError):  # NOTE: an abandoned generator is closed from another context
                pass

    generate_request._kvshield = True
    tokenizer_manager_cls.generate_request = generate_request
    _stamp_on_init(tokenized_cls)
    return True


def install_scheduler_side(scheduler_cls, req_cls):
    """Gives every Req the tenant its tokenized request carried."""
    if scheduler_cls is None or not hasattr(scheduler_cls, "handle_generate_request"):
        return _missing("Scheduler.handle_generate_request", "every request goes to the default tenant")
    if req_cls is None:
        return _missing("schedule_batch.Req", "every request goes to the default tenant")
    if getattr(scheduler_cls.handle_generate_request, "_kvshield", False):
        return True
    orig_handle = scheduler_cls.handle_generate_request

    @functools.wraps(orig_handle)
    def handle_generate_request(self, recv_req, *a, **k):
        token = _TENANT.set(getattr(recv_req, ATTR, None))
        try:
            return orig_handle(self, recv_req, *a, **k)
        finally:
            _TENANT.reset(token)

    handle_generate_request._kvshield = True
    scheduler_cls.handle_generate_request = handle_generate_request
    _stamp_on_init(req_cls)
    return True


def install_forward_hook(model_runner_cls):
    """Notes each forward launch on the allocator of the model runner that launched it."""
    orig = getattr(model_runner_cls, "forward", None)
    if orig is None:
        return _missing("ModelRunner.forward", "GPU protection is ordered only after the engine stream it started on")
    if getattr(orig, "_kvshield", False):
        return True

    @functools.wraps(orig)
    def forward(self, *a, **k):
        out = orig(self, *a, **k)
        alloc = getattr(self, "token_to_kv_pool_allocator", None)
        if hasattr(alloc, "_launch_fence"):  # NOTE: kvshield's allocator only; SGLang's own wants an event
            alloc.note_forward_launch()
        return out

    forward._kvshield = True
    model_runner_cls.forward = forward
    return True


def install():
    """Installs every hook this SGLang offers; returns {hook: installed}."""
    resolver = TenantResolver.from_env()
    return {
        "tenant-tokenizer": install_tokenizer_side(_lookup("sglang.srt.managers.tokenizer_manager", "TokenizerManager"),
                                                   _lookup("sglang.srt.managers.io_struct", "TokenizedGenerateReqInput"),
                                                   resolver),
        "tenant-scheduler": install_scheduler_side(_lookup("sglang.srt.managers.scheduler", "Scheduler"),
                                                   _lookup("sglang.srt.managers.schedule_batch", "Req")),
        "forward-launch": install_forward_hook(_lookup("sglang.srt.model_executor.model_runner", "ModelRunner")),
    }
