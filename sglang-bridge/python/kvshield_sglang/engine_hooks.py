"""Hooks into SGLang beyond the allocator, each probed by feature (a missing target is logged
loudly and left out; the allocator keeps working):

- **Trusted tenant, end to end.** In the HTTP/tokenizer process, ``TokenizerManager.generate_request``
  (every HTTP entry point passes the FastAPI request to it) resolves the tenant from the request's
  headers (the gateway's tenant header, or the API key in ``Authorization: Bearer`` through the
  server-side map), and every ``TokenizedGenerateReqInput`` built while it runs carries it to the
  scheduler, on the first channel this SGLang offers:

  - an extra attribute ``kvshield_tenant`` (request structs with a ``__dict__``: dataclasses), set
    unconditionally at construction, so nothing a client sends survives;
  - otherwise (msgspec Structs take no extra attribute) the struct's ``extra_key`` field: the
    result of ``TokenizerManager._create_tokenized_object`` gets its ``extra_key`` (the client's
    value or None) replaced by a sealed envelope (:class:`~kvshield_sglang.tenants.TenantChannel`:
    tenant and original value under an HMAC bound to the request id), always.

  In the scheduler, ``Scheduler.handle_generate_request`` (batches go through it per request) reads
  the attribute, or opens the envelope and puts the original ``extra_key`` back before SGLang sees
  the request, so SGLang's own use of the field (prefix-cache namespaces) is unchanged; every ``Req``
  built inside takes the tenant over. An envelope that does not verify (a client's, or one from an
  entry point that never sealed) selects nothing: the request goes to the default tenant, as does
  any request without a trusted tenant.
- **Forward launches.** After each ``ModelRunner.forward`` call the allocator's launch fence notes
  the current stream (:mod:`launch_fence`), so GPU protection waits for forwards already launched.
"""

import contextvars
import functools
import inspect
import logging

from .tenants import TenantChannel, TenantResolver

logger = logging.getLogger(__name__)
ATTR = "kvshield_tenant"
# The tokenized request's server-side string field that carries the sealed tenant where ATTR cannot.
FIELD = "extra_key"
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


def declares_field(cls, name):
    """Whether ``cls`` declares field ``name`` (a msgspec Struct's ``__struct_fields__``, or a dataclass)."""
    fields = getattr(cls, "__struct_fields__", None)
    return name in (fields if fields is not None else getattr(cls, "__dataclass_fields__", {}))


def _stamp_on_init(cls):
    """Every instance of ``cls`` built from now on carries the tenant of the current context (or None)."""
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def init(self, *a, **k):
        orig_init(self, *a, **k)
        setattr(self, ATTR, _TENANT.get())

    cls.__init__ = init


def _seal_on_create(tokenizer_manager_cls, tokenized_cls, channel):
    """Every tokenized generate request built from now on carries the current context's tenant
    sealed in its ``extra_key``, around whatever value it had."""
    orig_create = tokenizer_manager_cls._create_tokenized_object

    @functools.wraps(orig_create)
    def create(self, *a, **k):
        out = orig_create(self, *a, **k)
        if isinstance(out, tokenized_cls):
            setattr(out, FIELD, channel.seal(out.rid, _TENANT.get(), getattr(out, FIELD)))
        return out

    tokenizer_manager_cls._create_tokenized_object = create


def install_tokenizer_side(tokenizer_manager_cls, tokenized_cls, resolver, channel):
    """Resolves each HTTP request's tenant and puts it on the tokenized requests built for it."""
    if tokenizer_manager_cls is None or not hasattr(tokenizer_manager_cls, "generate_request"):
        return _missing("TokenizerManager.generate_request", "every request goes to the default tenant")
    if getattr(tokenizer_manager_cls.generate_request, "_kvshield", False):
        return True
    if not inspect.isasyncgenfunction(tokenizer_manager_cls.generate_request):
        return _missing("TokenizerManager.generate_request as an async generator", "every request goes to the default tenant")
    if carries_attributes(tokenized_cls):
        carry = functools.partial(_stamp_on_init, tokenized_cls)
    elif (tokenized_cls is not None and declares_field(tokenized_cls, FIELD)
          and hasattr(tokenizer_manager_cls, "_create_tokenized_object")):
        carry = functools.partial(_seal_on_create, tokenizer_manager_cls, tokenized_cls, channel)
    else:
        return _missing(f"TokenizedGenerateReqInput that takes an extra attribute, nor one with an {FIELD} field"
                        " built by TokenizerManager._create_tokenized_object", "every request goes to the default tenant")
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
    carry()
    return True


def received_tenant(recv_req, channel):
    """The tenant the tokenizer process resolved for a tokenized request: its ``kvshield_tenant``
    attribute, else the envelope sealed in its ``extra_key``, which is replaced by the original
    value. None (the default tenant) for anything else."""
    if ATTR in getattr(recv_req, "__dict__", ()):
        return getattr(recv_req, ATTR)
    rid = getattr(recv_req, "rid", None)
    sealed, tenant, original = channel.open(rid, getattr(recv_req, FIELD, None))
    if sealed:
        setattr(recv_req, FIELD, original)
        return tenant
    if isinstance(original, str) and original.startswith(TenantChannel.PREFIX):
        logger.error("kvshield: request %s carries a tenant envelope this server did not seal; it goes to the"
                     " default tenant", rid)
    return None


def install_scheduler_side(scheduler_cls, req_cls, channel):
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
        token = _TENANT.set(received_tenant(recv_req, channel))
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
    channel = TenantChannel.from_rank_dir()
    return {
        "tenant-tokenizer": install_tokenizer_side(_lookup("sglang.srt.managers.tokenizer_manager", "TokenizerManager"),
                                                   _lookup("sglang.srt.managers.io_struct", "TokenizedGenerateReqInput"),
                                                   resolver, channel),
        "tenant-scheduler": install_scheduler_side(_lookup("sglang.srt.managers.scheduler", "Scheduler"),
                                                   _lookup("sglang.srt.managers.schedule_batch", "Req"), channel),
        "forward-launch": install_forward_hook(_lookup("sglang.srt.model_executor.model_runner", "ModelRunner")),
    }
