"""Hooks into SGLang beyond the allocator, each found by name and signature (:mod:`kvshield_sglang.hooks`):

- **Trusted tenant, end to end.** In the HTTP/tokenizer process, ``TokenizerManager.generate_request``
  (every HTTP entry point passes the FastAPI request to it) resolves the tenant from the request's
  headers (the gateway's tenant header, or the API key in ``Authorization: Bearer`` through the
  server-side map). SGLang's tokenized request is a ``msgspec.Struct`` (no extra attribute travels), so
  the result of ``TokenizerManager._create_tokenized_object`` gets its ``extra_key`` (the client's value
  or None) replaced by a sealed envelope (:class:`~kvshield_sglang.tenants.TenantChannel`: tenant and
  original value under an HMAC bound to the request id), always.

  In the scheduler, ``Scheduler.handle_generate_request`` (batches go through it per request) opens the
  envelope and puts the original ``extra_key`` back before SGLang sees the request, so SGLang's own use of
  the field (prefix-cache namespaces) is unchanged; every ``Req`` built inside takes the tenant over as
  ``req.kvshield_tenant``. An envelope that does not verify (a client's, or one from an entry point that
  never sealed) selects nothing: the request goes to the default tenant, as does any request without a
  trusted tenant.
- **Forward launches.** After each ``ModelRunner.forward`` call the allocator's launch fence notes
  the current stream (:mod:`launch_fence`), so GPU protection waits for forwards already launched.
"""

import contextvars
import functools
import inspect
import logging

from . import hooks
from .tenants import TenantChannel

logger = logging.getLogger(__name__)
ATTR = "kvshield_tenant"
# The tokenized request's server-side string field that carries the sealed tenant to the scheduler.
FIELD = "extra_key"
# The tenant of the HTTP request being tokenized (tokenizer process), or of the tokenized request
# being turned into a Req (scheduler process).
_TENANT = contextvars.ContextVar("kvshield_tenant", default=None)


def declares_field(cls, name):
    """Whether ``cls`` declares field ``name`` (a msgspec Struct's ``__struct_fields__``)."""
    return name in (getattr(cls, "__struct_fields__", None) or ())


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


def install_tokenizer_side(resolver, channel=None):
    """Resolves each HTTP request's tenant and seals it into the tokenized requests built for it."""
    channel = channel or TenantChannel.from_rank_dir()
    module = "sglang.srt.managers.tokenizer_manager"
    manager = hooks.lookup(module, "TokenizerManager")
    tokenized_cls = hooks.lookup("sglang.srt.managers.io_struct", "TokenizedGenerateReqInput")
    generate = hooks.expect(hooks.lookup(module, "TokenizerManager.generate_request"),
                            "TokenizerManager.generate_request", ("self", "obj", "request"))
    hooks.expect(hooks.lookup(module, "TokenizerManager._create_tokenized_object"),
                 "TokenizerManager._create_tokenized_object", ("self", "obj"))
    if getattr(generate, "_kvshield", False):
        return
    if not inspect.isasyncgenfunction(generate):
        raise hooks.HookError("TokenizerManager.generate_request is not an async generator")
    if not declares_field(tokenized_cls, FIELD):
        raise hooks.HookError(f"TokenizedGenerateReqInput declares no {FIELD} field to carry the sealed tenant")

    @functools.wraps(generate)
    async def generate_request(self, obj, request=None, *a, **k):
        headers = getattr(request, "headers", None) if request is not None else None
        token = _TENANT.set(resolver.resolve_http(headers) if headers is not None else None)
        try:
            async for out in generate(self, obj, request, *a, **k):
                yield out
        finally:
            try:
                _TENANT.reset(token)
            except (ValueError, RuntimeError):  # NOTE: an abandoned generator is closed from another context
                pass

    generate_request._kvshield = True
    manager.generate_request = generate_request
    _seal_on_create(manager, tokenized_cls, channel)


def received_tenant(recv_req, channel):
    """The tenant the tokenizer process resolved for a tokenized request: the envelope sealed in its
    ``extra_key``, which is replaced by the original value. None (the default tenant) for anything else."""
    rid = getattr(recv_req, "rid", None)
    sealed, tenant, original = channel.open(rid, getattr(recv_req, FIELD, None))
    if sealed:
        setattr(recv_req, FIELD, original)
        return tenant
    if isinstance(original, str) and original.startswith(TenantChannel.PREFIX):
        logger.error("kvshield: request %s carries a tenant envelope this server did not seal; it goes to the"
                     " default tenant", rid)
    return None


def install_scheduler_side(resolver, channel=None):
    """Gives every Req the tenant its tokenized request carried."""
    channel = channel or TenantChannel.from_rank_dir()
    scheduler = hooks.lookup("sglang.srt.managers.scheduler", "Scheduler")
    req_cls = hooks.lookup("sglang.srt.managers.schedule_batch", "Req")
    handle = hooks.expect(hooks.lookup("sglang.srt.managers.scheduler", "Scheduler.handle_generate_request"),
                          "Scheduler.handle_generate_request", ("self", "recv_req"))
    hooks.expect(req_cls.__init__, "Req.__init__", ("self",))
    if getattr(handle, "_kvshield", False):
        return

    @functools.wraps(handle)
    def handle_generate_request(self, recv_req, *a, **k):
        # NOTE: every Req built here names its tenant (the default one when none was resolved); a Req built
        # elsewhere carries none, and the handoff hooks refuse it
        token = _TENANT.set(received_tenant(recv_req, channel) or resolver.default_tenant)
        try:
            return handle(self, recv_req, *a, **k)
        finally:
            _TENANT.reset(token)

    handle_generate_request._kvshield = True
    scheduler.handle_generate_request = handle_generate_request
    _stamp_on_init(req_cls)


def install_forward_hook(resolver):
    """Notes each forward launch on the allocator of the model runner that launched it."""
    module = "sglang.srt.model_executor.model_runner"
    runner = hooks.lookup(module, "ModelRunner")
    orig = hooks.expect(hooks.lookup(module, "ModelRunner.forward"), "ModelRunner.forward", ("self", "forward_batch"))
    if getattr(orig, "_kvshield", False):
        return

    @functools.wraps(orig)
    def forward(self, *a, **k):
        out = orig(self, *a, **k)
        alloc = getattr(self, "token_to_kv_pool_allocator", None)
        if hasattr(alloc, "_launch_fence"):  # NOTE: kvshield's allocator only; SGLang's own wants an event
            alloc.note_forward_launch()
        return out

    forward._kvshield = True
    runner.forward = forward
