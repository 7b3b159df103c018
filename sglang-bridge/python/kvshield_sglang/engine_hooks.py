"""Hooks into SGLang beyond the allocator, each found by name and signature (:mod:`kvshield_sglang.hooks`):

- **Trusted tenant, end to end.** In the HTTP/tokenizer process, ``TokenizerManager.generate_request``
  (every HTTP entry point passes the FastAPI request to it, generate and embedding alike) resolves the
  tenant from the request's headers (the gateway's tenant header, or the API key in ``Authorization:
  Bearer`` through the server-side map). SGLang's tokenized requests are ``msgspec.Struct``s (no extra
  attribute travels), so each one ``TokenizerManager._create_tokenized_object`` builds gets a server-side
  string field of its type (:data:`CARRIERS`: ``extra_key`` of a generate request, ``lora_id`` of an
  embedding request; the client's value or None) replaced by a sealed envelope
  (:class:`~kvshield_sglang.tenants.TenantChannel`: tenant and original value under an HMAC bound to the
  request id), always. A type it cannot seal is refused while tenants are configured.

  In the scheduler, each type's handler (``Scheduler.handle_generate_request``,
  ``handle_embedding_request``; the batch handlers hand each item to them) opens the envelope and puts the
  original value back before SGLang sees the request, so SGLang's own use of the field is unchanged; every
  ``Req`` built inside takes the tenant over as ``req.kvshield_tenant``. An envelope that does not verify
  (a client's, or one from an entry point that never sealed) selects nothing: the request goes to the
  default tenant, as does any request without a trusted tenant. While tenants are configured, a tokenized
  request type of this SGLang without a carrier stops the rank at start, and a ``Req`` a batch handler
  builds itself (not through its item's handler) is aborted, naming it: neither runs as the default tenant.
  A decode server's rebootstrap recompute (a POST past the gateway) runs as the tenant the decode server
  sealed in its ``extra_key`` under the deployment's recompute key (:func:`recomputed_tenant`).
- **Tree namespaces by tenant.** SGLang's trees scope a cached prefix by ``Req.extra_key`` (and
  ``cache_salt``); the client's value alone would let one tenant's request hit another's cached prefix in
  the stock trees. ``Req.extra_key`` reads as the request's tenant (length-prefixed, so no client value
  reaches into another tenant's namespace) followed by the client's value (:func:`tree_namespace`), kept
  verbatim; SGLang's own appends to what it read (elastic EP) keep the client's part and stay within the tenant.
- **Forward launches.** After each ``ModelRunner.forward`` call the allocator's launch fence notes
  the current stream (:mod:`launch_fence`), so GPU protection waits for forwards already launched.
"""

import contextlib
import contextvars
import copy
import functools
import importlib
import inspect
import logging
import re

from . import hooks
from .tenants import RecomputeChannel, TenantChannel

logger = logging.getLogger(__name__)
ATTR = "kvshield_tenant"
IO_STRUCT = "sglang.srt.managers.io_struct"
# Each tokenized request type the scheduler builds a Req from: its server-side string field that carries the
# sealed tenant to the scheduler, and the Scheduler handler that builds its Req.
CARRIERS = (("TokenizedGenerateReqInput", "extra_key", "handle_generate_request"),
            ("TokenizedEmbeddingReqInput", "lora_id", "handle_embedding_request"))
# Their batches: the Scheduler handler hands each item to the item type's handler.
BATCHES = (("BatchTokenizedGenerateReqInput", "handle_batch_generate_request"),
           ("BatchTokenizedEmbeddingReqInput", "handle_batch_embedding_request"))
_TOKENIZED = re.compile(r"(Batch)?Tokenized\w*ReqInput")
# The tenant of the HTTP request being tokenized (tokenizer process).
_TENANT = contextvars.ContextVar("kvshield_tenant", default=None)
# What the Reqs being built take (scheduler process): a Scope, or None outside any hooked handler.
_SCOPE = contextvars.ContextVar("kvshield_scope", default=None)
# What an abort's envelope is bound to (its rid is the sealed value), and the tenant whose abort the scheduler runs.
_ABORT = "abort"
_ABORTING = contextvars.ContextVar("kvshield_aborting", default=None)


class Scope:
    """The tenant every ``Req`` built in a context takes (None: none resolved), each one listed in ``built``."""

    __slots__ = ("tenant", "built")

    def __init__(self, tenant):
        self.tenant, self.built = tenant, []


@contextlib.contextmanager
def building(tenant=None):
    """A :class:`Scope` for the ``Req`` objects built inside (nested scopes take their own)."""
    scope = Scope(tenant)
    token = _SCOPE.set(scope)
    try:
        yield scope
    finally:
        _SCOPE.reset(token)


def building_tenant():
    """The tenant the ``Req`` objects built in this context take (None: outside any hooked handler)."""
    scope = _SCOPE.get()
    return None if scope is None else scope.tenant


def declares_field(cls, name):
    """Whether ``cls`` declares field ``name`` (a msgspec Struct's ``__struct_fields__``)."""
    return name in (getattr(cls, "__struct_fields__", None) or ())


def _carriers():
    """{tokenized request class: its carrier field} of this SGLang; raises HookError for a carrier it lacks."""
    out = {}
    for name, field, _ in CARRIERS:
        cls = hooks.lookup(IO_STRUCT, name)
        if not declares_field(cls, field):
            raise hooks.HookError(f"{name} declares no {field} field to carry the sealed tenant")
        out[cls] = field
    return out


def check_every_tokenized_type(resolver):
    """Raises HookError, while tenants are configured, naming each tokenized request type of this SGLang's
    ``io_struct`` (``Tokenized*ReqInput``, ``BatchTokenized*ReqInput``) kvshield cannot carry a tenant in:
    its requests would run as the default tenant."""
    known = {n for n, _, _ in CARRIERS} | {n for n, _ in BATCHES}
    module = importlib.import_module(IO_STRUCT)
    unknown = sorted(n for n, v in vars(module).items() if isinstance(v, type) and _TOKENIZED.fullmatch(n)
                     and n not in known)
    if unknown and resolver.configured:
        raise hooks.HookError(f"kvshield cannot carry the tenant of SGLang's {', '.join(unknown)}: with a tenant "
                              "header or API keys configured its requests would run as the default tenant")


def _stamp_on_init(cls):
    """Every instance of ``cls`` built from now on carries the tenant of the current scope (or None),
    and is listed in it."""
    orig_init = cls.__init__

    @functools.wraps(orig_init)
    def init(self, *a, **k):
        orig_init(self, *a, **k)
        scope = _SCOPE.get()
        setattr(self, ATTR, None if scope is None else scope.tenant)
        if scope is not None:
            scope.built.append(self)

    cls.__init__ = init


def _seal_on_create(tokenizer_manager_cls, carriers, channel, resolver):
    """Every tokenized request built from now on carries the current context's tenant sealed in its type's
    carrier field, around whatever value it had; a type without one is refused while tenants are configured."""
    orig_create = tokenizer_manager_cls._create_tokenized_object

    @functools.wraps(orig_create)
    def create(self, *a, **k):
        out = orig_create(self, *a, **k)
        field = carriers.get(type(out))
        if field is not None:
            setattr(out, field, channel.seal(out.rid, _TENANT.get(), getattr(out, field)))
        elif resolver.configured:
            raise ValueError(f"kvshield cannot carry the tenant of request {getattr(out, 'rid', '?')} "
                             f"({type(out).__name__}): refused")
        return out

    tokenizer_manager_cls._create_tokenized_object = create


def recomputed_tenant(obj, resolved, recompute, resolver):
    """The tenant of HTTP request ``obj`` whose gateway resolved ``resolved``: the one a decode server sealed in
    its ``extra_key`` when it is a rebootstrap recompute (:class:`~kvshield_sglang.tenants.RecomputeChannel`;
    ``extra_key`` becomes the client's value again), else ``resolved``. Raises ValueError, naming the request,
    for a recompute envelope this server cannot open (no ``KVSHIELD_RECOMPUTE_KEY``, another key, tampered, inside a
    batch, or a request other than the one it was sealed for: any field changed or added) or one that contradicts
    the gateway's tenant: refused, never run as the default tenant."""
    value = getattr(obj, "extra_key", None)
    values = value if isinstance(value, list) else [value]
    if not any(isinstance(v, str) and v.startswith(RecomputeChannel.PREFIX) for v in values):
        return resolved
    rid = getattr(obj, "rid", None)
    opened = None if recompute is None or isinstance(value, list) else recompute.open_request(obj)
    if opened is None:
        raise ValueError(f"kvshield: request {rid} carries a rebootstrap recompute envelope this server cannot open:"
                         " refused")
    tenant, original = opened
    if resolved not in (None, resolver.default_tenant, tenant):
        raise ValueError(f"kvshield: request {rid} carries a rebootstrap recompute envelope of another tenant than"
                         " its gateway's: refused")
    obj.extra_key = original
    return tenant


def _rust_server():
    """Whether SGLang's embedded Rust server takes this server's requests (``SGLANG_RUST_SERVER``, as SGLang reads it)."""
    try:
        from sglang.srt.environ import envs
    except ImportError:
        return False
    flag = getattr(envs, "SGLANG_RUST_SERVER", None)
    return bool(flag.get()) if flag is not None else False


def install_tokenizer_side(resolver, channel=None, recompute=None):
    """Resolves each HTTP request's tenant (a decode server's rebootstrap recompute: the tenant it sealed) and
    seals it into the tokenized requests built for it."""
    if resolver.configured and _rust_server():
        raise hooks.HookError("SGLANG_RUST_SERVER is set: SGLang's embedded Rust tokenizer hands requests to the scheduler"
                              " past TokenizerManager, so the tenant header and API keys are never read and every tenant's"
                              " requests would run as the default tenant")
    channel = channel or TenantChannel.from_rank_dir()
    recompute = recompute or RecomputeChannel.from_env()
    module = "sglang.srt.managers.tokenizer_manager"
    manager = hooks.lookup(module, "TokenizerManager")
    carriers = _carriers()
    check_every_tokenized_type(resolver)
    generate = hooks.expect(hooks.lookup(module, "TokenizerManager.generate_request"),
                            "TokenizerManager.generate_request", ("self", "obj", "request"))
    hooks.expect(hooks.lookup(module, "TokenizerManager._create_tokenized_object"),
                 "TokenizerManager._create_tokenized_object", ("self", "obj"))
    if getattr(generate, "_kvshield", False):
        return
    if not inspect.isasyncgenfunction(generate):
        raise hooks.HookError("TokenizerManager.generate_request is not an async generator")

    @functools.wraps(generate)
    async def generate_request(self, obj, request=None, *a, **k):
        headers = getattr(request, "headers", None) if request is not None else None
        resolved = resolver.resolve_http(headers) if headers is not None else None
        token = _TENANT.set(recomputed_tenant(obj, resolved, recompute, resolver))
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
    _seal_on_create(manager, carriers, channel, resolver)
    _rebind_on_send(manager, carriers, channel)


def _rebind_on_send(tokenizer_manager_cls, carriers, channel):
    """Every tokenized request sent to the scheduler carries its envelope bound to the id it is sent under: SGLang
    copies a sealed request under new ids (parallel sampling: a prefix-caching copy and one per sample) after
    ``_create_tokenized_object`` sealed it. The id's ``ReqState`` notes the tenant it was sent for."""
    one = hooks.expect(tokenizer_manager_cls._send_one_request, "TokenizerManager._send_one_request",
                       ("self", "tokenized_obj"))
    batch = hooks.expect(tokenizer_manager_cls._send_batch_request, "TokenizerManager._send_batch_request",
                         ("self", "tokenized_objs"))

    def rebind(manager, obj):
        field = carriers.get(type(obj))
        if field is not None:
            setattr(obj, field, channel.rebind(getattr(obj, field), obj.rid))
        state = manager.rid_to_state.get(obj.rid)
        if state is not None:  # NOTE: the tenant an abort of this id is sealed for (install_abort_scoping)
            setattr(state, ATTR, _TENANT.get())

    @functools.wraps(one)
    def send_one(self, tokenized_obj, *a, **k):
        rebind(self, tokenized_obj)
        return one(self, tokenized_obj, *a, **k)

    @functools.wraps(batch)
    def send_batch(self, tokenized_objs, *a, **k):
        for obj in tokenized_objs:
            rebind(self, obj)
        return batch(self, tokenized_objs, *a, **k)

    tokenizer_manager_cls._send_one_request, tokenizer_manager_cls._send_batch_request = send_one, send_batch


def received_tenant(recv_req, channel, field):
    """The tenant the tokenizer process resolved for a tokenized request: the envelope sealed in its carrier
    ``field``, which is replaced by the original value. None (the default tenant) for anything else."""
    rid = getattr(recv_req, "rid", None)
    sealed, tenant, original = channel.open(rid, getattr(recv_req, field, None))
    if sealed:
        setattr(recv_req, field, original)
        return tenant
    if isinstance(original, str) and original.startswith(TenantChannel.PREFIX):
        logger.error("kvshield: request %s carries a tenant envelope this server did not seal; it goes to the"
                     " default tenant", rid)
    return None


def _opening(handle, field, channel, resolver):
    """``handle`` (a tokenized request type's Scheduler handler) with every Req built inside naming the
    tenant its request carried sealed in ``field`` (the default one when none was resolved); a Req built
    elsewhere carries none, and the handoff hooks refuse it."""

    @functools.wraps(handle)
    def handler(self, recv_req, *a, **k):
        with building(received_tenant(recv_req, channel, field) or resolver.default_tenant):
            return handle(self, recv_req, *a, **k)

    handler._kvshield = True
    return handler


def _batching(handle, name, resolver):
    """``handle`` (a batch's Scheduler handler, which hands each item to its type's handler): while tenants
    are configured, a Req it builds itself (its item opened by no handler) is aborted, naming it."""

    @functools.wraps(handle)
    def handler(self, recv_req, *a, **k):
        with building(resolver.default_tenant) as scope:
            out = handle(self, recv_req, *a, **k)
        if resolver.configured:
            for req in scope.built:
                why = f"kvshield: request {req.rid} of a {name} was built outside its item's handler: no tenant"
                logger.error("%s; aborted", why)
                req.set_finish_with_abort(why)
        return out

    handler._kvshield = True
    return handler


def install_scheduler_side(resolver, channel=None):
    """Gives every Req the tenant its tokenized request carried."""
    channel = channel or TenantChannel.from_rank_dir()
    module = "sglang.srt.managers.scheduler"
    scheduler = hooks.lookup(module, "Scheduler")
    req_cls = hooks.lookup("sglang.srt.managers.schedule_batch", "Req")
    _carriers()
    check_every_tokenized_type(resolver)
    # (handler, type name, carrier field; None: a batch's handler)
    handled = [(h, n, field) for n, field, h in CARRIERS] + [(h, n, None) for n, h in BATCHES]
    stock = {h: hooks.expect(hooks.lookup(module, f"Scheduler.{h}"), f"Scheduler.{h}", ("self", "recv_req"))
             for h, _, _ in handled}
    hooks.expect(req_cls.__init__, "Req.__init__", ("self",))
    if getattr(stock[handled[0][0]], "_kvshield", False):
        return
    for h, name, field in handled:
        setattr(scheduler, h, _opening(stock[h], field, channel, resolver) if field is not None
                else _batching(stock[h], name, resolver))
        hooks.bound(scheduler, h, getattr(scheduler, h))
    _stamp_on_init(req_cls)
    _namespace_trees_by_tenant(req_cls, resolver)


class _Unmatched(str):
    """A request id SGLang's abort matching (``rid.startswith(abort.rid)``) never selects."""

    __slots__ = ()

    def startswith(self, *a, **k):
        return False


def install_abort_scoping(resolver, channel=None):
    """A client's abort reaches only its own tenant's requests. SGLang's ``Scheduler.abort_request`` ends every
    request whose rid starts with the abort's, whatever its tenant, and ``TokenizerManager.abort_request`` sends a
    client's rid with no tenant (its disconnect, ``/abort_request``). The tokenizer seals into an abort's ``rid``
    the tenant its request was sent for (:func:`_rebind_on_send`; bound to :data:`_ABORT`), and refuses one naming
    an id it sent for no tenant. The scheduler opens it and runs SGLang's matching, prefix semantics kept, with
    every other tenant's ``Req`` (and EPD request still waiting for its embeddings) reading its rid as one no abort
    selects. An abort without an envelope that
    verifies is refused (no request matched), except ``abort_all``, which SGLang's own pause and weight updates
    send: it ends every tenant's requests, as SGLang's."""
    channel = channel or TenantChannel.from_rank_dir()
    manager = hooks.lookup("sglang.srt.managers.tokenizer_manager", "TokenizerManager")
    scheduler = hooks.lookup("sglang.srt.managers.scheduler", "Scheduler")
    req_cls = hooks.lookup("sglang.srt.managers.schedule_batch", "Req")
    abort_cls = hooks.lookup(IO_STRUCT, "AbortReq")
    for field in ("rid", "abort_all"):
        if not declares_field(abort_cls, field):
            raise hooks.HookError(f"AbortReq declares no {field} field: kvshield cannot scope aborts by tenant")
    waiting_cls = hooks.lookup("sglang.srt.disaggregation.encoder.receiver", "WaitingMMRequestBase")
    carriers = _carriers()
    dispatch = hooks.expect(manager._dispatch_to_scheduler, "TokenizerManager._dispatch_to_scheduler",
                            ("self", "obj"))
    abort = hooks.expect(scheduler.abort_request, "Scheduler.abort_request", ("self", "recv_req"))
    hooks.expect(req_cls.__init__, "Req.__init__", ("self", "rid"))
    hooks.expect(waiting_cls.__init__, "WaitingMMRequestBase.__init__", ("self", "rid", "recv_req"))
    if getattr(abort, "_kvshield", False):
        return

    @functools.wraps(dispatch)
    def dispatch_to_scheduler(self, obj, *a, **k):
        if isinstance(obj, abort_cls) and not obj.abort_all:
            state = self.rid_to_state.get(obj.rid)
            if not hasattr(state, ATTR):
                logger.error("kvshield: abort of request %r, which this tokenizer sent for no tenant: refused",
                             obj.rid)
                return None
            obj.rid = channel.seal(_ABORT, getattr(state, ATTR), obj.rid)
        return dispatch(self, obj, *a, **k)

    @functools.wraps(abort)
    def abort_request(self, recv_req, *a, **k):
        sealed, tenant, rid = channel.open(_ABORT, recv_req.rid)
        if not sealed and recv_req.abort_all:  # NOTE: SGLang's own (pause, weight updates): every tenant's
            return abort(self, recv_req, *a, **k)
        if not sealed:
            logger.error("kvshield: abort of request %r carries no tenant this server sealed: refused, no request"
                         " matched", recv_req.rid)
            return None
        scoped = copy.copy(recv_req)  # NOTE: the received one stays sealed for whatever else reads it
        scoped.rid = rid
        token = _ABORTING.set(tenant or resolver.default_tenant)
        try:
            return abort(self, scoped, *a, **k)
        finally:
            _ABORTING.reset(token)

    def waiting_tenant(waiting):
        # NOTE: an EPD request waiting for its embeddings has not reached its handler: its envelope is still sealed
        recv_req = waiting.recv_req
        sealed, tenant, _ = channel.open(recv_req.rid, getattr(recv_req, carriers.get(type(recv_req), ""), None))
        return (tenant if sealed else None) or resolver.default_tenant

    dispatch_to_scheduler._kvshield = abort_request._kvshield = True
    manager._dispatch_to_scheduler, scheduler.abort_request = dispatch_to_scheduler, abort_request
    req_cls.rid = _scoped_rid(resolver.resolve_request)
    waiting_cls.rid = _scoped_rid(waiting_tenant)


def _scoped_rid(tenant_of):
    """The ``rid`` attribute of a class whose objects SGLang's abort matches: while a tenant's abort runs, an object
    of another tenant (``tenant_of(obj)``) reads it as one no abort selects."""

    def get(obj):
        rid = obj.__dict__.get("rid")
        tenant = _ABORTING.get()
        return rid if tenant is None or tenant_of(obj) == tenant else _Unmatched(rid)

    def set_(obj, value):
        obj.__dict__["rid"] = value

    return property(get, set_, doc="The request id; another tenant's matches no abort while a tenant's runs")


_TREE_TAG = "kvshield-tenant:"


def tree_namespace(tenant, extra_key):
    """The ``extra_key`` SGLang's trees see for a request of ``tenant`` whose client sent ``extra_key``."""
    return f"{_TREE_TAG}{len(tenant)}:{tenant}|{extra_key or ''}"


def client_extra_key(extra_key):
    """The client's part of a :func:`tree_namespace` (the value itself when it has no tenant tag); None when empty."""
    if extra_key and extra_key.startswith(_TREE_TAG):
        length, sep, rest = extra_key[len(_TREE_TAG):].partition(":")
        if sep and length.isdigit() and rest[int(length):int(length) + 1] == "|":
            extra_key = rest[int(length) + 1:]
    return extra_key or None


def _namespace_trees_by_tenant(req_cls, resolver):
    """``req.extra_key`` reads as :func:`tree_namespace` of the request's tenant, resolved at each read (so a
    tenant stamped after construction counts). The first assignment (``Req.__init__``: the client's value, with
    SGLang's ``lora_id`` appended) is kept verbatim; a later one that extends what the getter reads now (SGLang's
    elastic EP append) keeps it less the tenant's tag the getter prepended; any other value is kept verbatim, so
    no value a client writes is rewritten into another namespace of its tenant."""
    if "extra_key" not in inspect.signature(req_cls.__init__).parameters:
        raise hooks.HookError("Req.__init__ takes no extra_key: SGLang's tree namespaces moved; kvshield cannot"
                              " scope cached prefixes by tenant")

    def get(self):
        return tree_namespace(resolver.resolve_request(self), self.__dict__.get("_kvshield_extra_key"))

    def set_(self, value):
        if "_kvshield_extra_key" in self.__dict__ and isinstance(value, str) and value.startswith(get(self)):
            value = value[len(tree_namespace(resolver.resolve_request(self), None)):]
        self.__dict__["_kvshield_extra_key"] = value or None

    req_cls.extra_key = property(get, set_, doc="SGLang's tree namespace, scoped by the request's tenant")


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
    hooks.bound(runner, "forward", forward)
