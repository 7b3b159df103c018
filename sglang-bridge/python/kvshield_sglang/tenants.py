"""Which tenant a request belongs to, from a source the serving gateway controls.

Trusted sources, in order: a header the gateway sets after authenticating the caller (its name is
configured server-side; the gateway must strip any client-sent copy), then a server-side map of API
keys to tenants. A request with neither goes to the default tenant. Nothing a client writes into
the request body is ever read.
"""

import base64
import dataclasses
import hashlib
import hmac
import json
import logging
import os
import re
import secrets
import stat

from . import settings

logger = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,255}$")
_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # NOTE: RFC 9110's token, the characters of a field name


class TenantResolver:
    def __init__(self, header=None, api_keys=None, default_tenant="default"):
        self.header = header.lower() if header else None
        self._api_keys = dict(api_keys or {})
        for tenant in list(self._api_keys.values()) + [default_tenant]:
            _check_name(tenant, "tenant")
        self.default_tenant = default_tenant

    @classmethod
    def from_env(cls, env=None):
        """KVSHIELD_TENANT_HEADER, KVSHIELD_API_KEY_MAP (a JSON file: {"key": "tenant"}), KVSHIELD_DEFAULT_TENANT.
        Refuses, naming the setting, a key map other users may write, and any that would leave tenants silently
        unresolved: one set but empty, a header
        name no HTTP header can have, an empty map, an api key no bearer token can match or one listed twice (the
        keys themselves never shown), a default tenant the map gives keys to (a request without one would run as it)."""
        env = os.environ if env is None else env
        keys = {}
        path = settings.get("KVSHIELD_API_KEY_MAP", env)
        if path is not None:
            with open(path, encoding="utf-8") as f:
                mode = os.fstat(f.fileno()).st_mode
                if mode & 0o022:  # NOTE: read-only mounts (a Kubernetes secret's 0644 files) pass; owner and links are not judged
                    raise ValueError(f"KVSHIELD_API_KEY_MAP {path} (mode {oct(mode & 0o777)}) is writable by other users:"
                                     " whoever writes it gives any key any tenant; make it writable by its owner alone")
                try:
                    keys = json.load(f, object_pairs_hook=_pairs)
                except ValueError as e:
                    raise ValueError(f"KVSHIELD_API_KEY_MAP {path} is not JSON ({e})") from None
            if not isinstance(keys, dict) or not keys:
                raise ValueError(f"KVSHIELD_API_KEY_MAP {path} must hold a JSON object of api key -> tenant, at least one")
            bad = [i for i, k in enumerate(keys, 1) if not k or k != k.strip() or any(c.isspace() or not c.isprintable()
                                                                                    for c in k)]
            if bad:
                raise ValueError(f"KVSHIELD_API_KEY_MAP {path}: api key(s) number {bad} (not shown) are empty or hold"
                                 " blanks or control characters: the bearer token is read stripped, so such a key"
                                 " either never matches (its tenant's requests run as the default tenant) or, empty,"
                                 " matches a request that sends none")
        header = settings.get("KVSHIELD_TENANT_HEADER", env)
        if header is not None and not _HEADER_NAME.fullmatch(header):
            raise ValueError(f"KVSHIELD_TENANT_HEADER must be an HTTP header name (RFC 9110 token characters): no"
                             f" request could carry {settings.shown(header)}, so every request would run as the default"
                             " tenant")
        default = settings.get("KVSHIELD_DEFAULT_TENANT", env)
        default = "default" if default is None else default
        if default in keys.values():
            raise ValueError(f"KVSHIELD_DEFAULT_TENANT {default!r} is a tenant KVSHIELD_API_KEY_MAP gives api keys to: a"
                             " request without a key would run as that tenant, on its cached prefixes")
        return cls(header, keys, default)

    @property
    def configured(self):
        """Whether any request can have a tenant other than the default one (a tenant header or API keys)."""
        return bool(self.header or self._api_keys)

    def resolve(self, headers=None, api_key=None):
        """The tenant name for a request's gateway headers and authenticated API key. ``headers``: a mapping, or
        an object whose ``get`` looks names up case-insensitively (SGLang's gRPC bridge passes one)."""
        v = _header(headers, self.header) if self.header else None
        if v:
            _check_name(v, f"header {self.header}")
            return v
        if api_key is not None and api_key in self._api_keys:
            return self._api_keys[api_key]
        return self.default_tenant

    def resolve_request(self, req):
        """The tenant of an SGLang request: the one the HTTP process resolved from the gateway's
        header or API key (``req.kvshield_tenant``, set by :mod:`engine_hooks`), else from headers or
        a key put on the request server-side, else the default tenant."""
        tenant = getattr(req, "kvshield_tenant", None)
        if tenant is not None:
            try:
                _check_name(tenant, "request's resolved tenant")
                return tenant
            except ValueError as e:  # NOTE: never raise in the scheduler loop; the default tenant owns no one else's pages
                logger.error("kvshield: %s; request %s goes to the default tenant", e, getattr(req, "rid", "?"))
                return self.default_tenant
        return self.resolve(getattr(req, "kvshield_headers", None), getattr(req, "kvshield_api_key", None))

    def resolve_http(self, headers):
        """The tenant of an HTTP request from its headers alone: the gateway's tenant header, else the
        API key of an ``Authorization: Bearer`` header in the server-side map, else the default."""
        auth = _header(headers, "authorization")
        api_key = auth[7:].strip() if auth and auth.lower().startswith("bearer ") else None
        return self.resolve(headers, api_key)


def _header(headers, name):
    """The value of header ``name`` (lower case) in ``headers`` (None: absent): a mapping's item of that name in any
    case (Starlette's ``Headers``, a dict), else ``headers.get(name)``."""
    if headers is None:
        return None
    items = getattr(headers, "items", None)
    if items is None:
        return headers.get(name)
    for k, v in items():
        if k.lower() == name:
            return v
    return None


class TenantChannel:
    """Carries a request's resolved tenant from the tokenizer process to the schedulers inside a
    server-side string field of the tokenized request (SGLang versions whose request structs are
    msgspec Structs take no extra attribute).

    :meth:`seal` wraps the field's value (whatever the client put there) in an envelope: the tenant,
    the original value and the request id, authenticated with HMAC-SHA256 under a key only the
    server's processes hold. :meth:`open` gives the tenant and the original back only for an
    envelope that verifies, so a client-written value, even one shaped like an envelope and sent
    through an entry point that never sealed it, can never select a tenant.

    The key: 32 random bytes in ``tenant-channel.key`` (owner-only) of the rank directory the
    launching process exports to every process it spawns (:mod:`ranks`); the first process creates
    it atomically, the others read it. It never appears in logs, exceptions or ``repr``.
    """

    PREFIX = "kvshield-tenant/1:"
    KEY_FILE = "tenant-channel.key"
    KEY_BYTES = 32

    def __init__(self, key):
        if not isinstance(key, bytes) or len(key) != self.KEY_BYTES:
            raise ValueError(f"a tenant channel key is {self.KEY_BYTES} bytes")
        self._key = key

    def __repr__(self):
        return f"{type(self).__name__}(key=<hidden>)"

    @classmethod
    def from_rank_dir(cls, directory=None):
        """The channel of this server: its key file in the rank directory, created if absent."""
        from . import ranks

        path = os.path.join(directory or ranks.ensure_dir(), cls.KEY_FILE)
        if not os.path.exists(path):
            tmp = f"{path}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(secrets.token_bytes(cls.KEY_BYTES))
            try:
                os.link(tmp, path)  # NOTE: atomic; another process's key wins a race
            except FileExistsError:
                pass
            finally:
                os.unlink(tmp)
        return cls(_owner_only_key(path, "tenant channel key", cls.KEY_BYTES))

    def _mac(self, payload):
        # NOTE: the prefix is MACed too, so an envelope of one channel never opens on another under the same key
        return hmac.new(self._key, f"{self.PREFIX}{payload}".encode(), hashlib.sha256).hexdigest()

    def seal(self, rid, tenant, original):
        """The envelope for request ``rid``: ``tenant`` (None: the default tenant) and the field's ``original`` value."""
        payload = base64.urlsafe_b64encode(json.dumps([tenant, original, rid]).encode()).decode()
        return f"{self.PREFIX}{payload}.{self._mac(payload)}"

    def _verified(self, value):
        """``[tenant, original, rid]`` of an envelope this channel sealed (for any request), else None."""
        if not isinstance(value, str) or not value.startswith(self.PREFIX):
            return None
        payload, _, mac = value[len(self.PREFIX):].rpartition(".")
        if not payload or not hmac.compare_digest(mac.encode(), self._mac(payload).encode()):
            return None
        return json.loads(base64.urlsafe_b64decode(payload.encode()))

    def open(self, rid, value):
        """``(True, tenant, original)`` for an envelope sealed here for ``rid``; ``(False, None, value)``
        for anything else (not an envelope, another key, another request, tampered)."""
        opened = self._verified(value)
        if opened is None or opened[2] != rid:
            return False, None, value
        return True, opened[0], opened[1]

    def rebind(self, value, rid):
        """``value`` sealed for request ``rid`` instead, when it is an envelope this channel sealed for another
        request (SGLang's tokenizer copies a sealed request under a new id: parallel sampling); else ``value``.
        Only for requests the server built: the tokenizer process's own sends."""
        opened = self._verified(value)
        if opened is None or opened[2] == rid:
            return value
        return self.seal(rid, opened[0], opened[1])


class RecomputeChannel(TenantChannel):
    """Carries a retracted request's tenant from a decode server to its prefill server, whose ``/generate`` it
    re-enters for recomputation (SGLang's PD true-retraction rebootstrap): a plain HTTP POST between the two
    servers, past the gateway, with no tenant header. The decode server seals the request's tenant and the
    client's ``extra_key`` into the payload's ``extra_key`` (:meth:`seal`, bound to the request id); the prefill
    server's tokenizer hook opens it and runs the request as that tenant (:meth:`binding`: the whole request it was
    sealed for). The envelope is authenticated, not encrypted: like the prompt and output tokens the same POST
    carries, the tenant's name is readable on that link, which the deployment must keep private.

    The key: 32 bytes in the owner-only file ``KVSHIELD_RECOMPUTE_KEY`` names, the same file on the prefill and
    the decode servers of one deployment (the operator's to distribute, as the gateway's credentials are). Its
    envelopes and a server's own (:class:`TenantChannel`) never open each other's: distinct prefixes, both MACed.
    """

    PREFIX = "kvshield-recompute/1:"
    ENV = "KVSHIELD_RECOMPUTE_KEY"

    @staticmethod
    def binding(fields):
        """What an envelope is bound to: every field of the recompute request but ``extra_key`` (``fields``: name ->
        value, as posted), names and values, so an envelope lifted off the wire between the servers selects its
        tenant for that very request and nothing else."""
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), default=str)
        return json.dumps({"fields": sorted(fields), "sha256": hashlib.sha256(canonical.encode()).hexdigest()})

    def open_request(self, obj):
        """``(tenant, the client's extra_key)`` of the envelope in ``obj.extra_key`` (a ``GenerateReqInput``, as the
        prefill server's entry point received it) when it verifies and ``obj`` is the request it was sealed for: each
        bound field holds its bound value and every other field its default. None for anything else."""
        opened = self._verified(getattr(obj, "extra_key", None))
        if opened is None or not dataclasses.is_dataclass(obj):
            return None
        try:
            names = json.loads(opened[2])["fields"]
        except (TypeError, ValueError, KeyError):
            return None
        if not isinstance(names, list) or not all(isinstance(n, str) and hasattr(obj, n) for n in names):
            return None
        for f in dataclasses.fields(obj):
            if f.name != "extra_key" and f.name not in names and not _is_default(getattr(obj, f.name), f):
                return None
        if self.binding({n: getattr(obj, n) for n in names}) != opened[2]:
            return None
        return opened[0], opened[1]

    @classmethod
    def from_env(cls, env=None):
        """The deployment's channel, or None when ``KVSHIELD_RECOMPUTE_KEY`` is unset. Raises ValueError, naming
        the file, for a file others may read or write, or one that is not 32 bytes."""
        path = settings.get(cls.ENV, env)
        if path is None:
            return None
        return cls(_owner_only_key(path, cls.ENV, cls.KEY_BYTES))


def _owner_only_key(path, what, key_bytes):
    """The key in file ``path`` (``what`` names it in refusals): whoever reads (or wrote) a channel's key forges any
    request's tenant, so only this user's owner-only regular file of ``key_bytes`` bytes, never followed through a link,
    judged on the file opened. Raises ValueError (OSError for a link), naming the file, never its bytes."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise ValueError(f"{what} {path} (mode {oct(st.st_mode & 0o777)}, owner uid {st.st_uid}) must be owner-only:"
                             f" a regular file owned by uid {os.geteuid()} that no other user may read or write")
        if st.st_size != key_bytes:
            raise ValueError(f"{what} {path} holds {st.st_size} bytes; the key is {key_bytes} bytes")
        return f.read()


def _is_default(value, field):
    """Whether ``value`` is dataclass ``field``'s default."""
    if field.default is not dataclasses.MISSING:
        default = field.default
    elif field.default_factory is not dataclasses.MISSING:
        default = field.default_factory()
    else:
        return False
    try:
        return value is default or bool(value == default)
    except (TypeError, ValueError, RuntimeError):  # NOTE: a tensor or array compares elementwise: not a default
        return False


def _pairs(pairs):
    """A JSON object's dict, refusing a key listed twice (``json`` would keep the last silently)."""
    out = {}
    for i, (k, v) in enumerate(pairs, 1):
        if k in out:
            raise ValueError(f"key number {i} (not shown) is listed twice")
        out[k] = v
    return out


def _check_name(name, what):
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what}: tenant name {name!r} must match {_NAME.pattern}")


def decode_reserve_tokens():
    """Tokens SGLang allocates beyond a request's committed length at each speculative decode step (0 without
    speculative decoding: one token per step, within ``max_new_tokens``). EAGLE's ``eagle_prepare_for_decode``
    allocates up to ``committed + get_alloc_reserve_per_decode()``, page aligned; DFLASH's reserve
    (``2 * speculative_num_draft_tokens``) is never larger."""
    from sglang.srt.mem_cache.allocation_sizing import get_alloc_reserve_per_decode
    from sglang.srt.runtime_context import get_spec

    return 0 if get_spec().speculative_algorithm is None else int(get_alloc_reserve_per_decode())


def foreign_prefix_pages(req, page_size):
    """Pages of ``req``'s matched prefix that its tenant does not own: a prefix the kvshield prefix cache matched in
    the operator's shared namespace (``req.kvshield_shared_prefix``: its last node and length, whole pages, the
    shared tenant's), while ``req`` still reads it (its ``last_node`` is that match's; a later match replaces it).
    0 for any other prefix (the tenant's own tree or session pages) and any other tree cache."""
    shared = getattr(req, "kvshield_shared_prefix", None)
    return 0 if shared is None or shared[0] is not req.last_node else shared[1] // page_size


def request_pages(req, page_size):
    """Pages ``req`` may hold at most over the rest of its life, one rule per state (a tenant quota's worst case),
    in every state less the pages of a prefix its tenant does not own (:func:`foreign_prefix_pages`):

    - finished (``req.finished()``: SGLang released its KV or is about to; its running batch may still list it
      until ``update_running_batch`` filters it): 0, it allocates nothing more.
    - aborted (``to_finish`` set; SGLang finishes it at the result of the next forward it runs): with KV and an
      output token (decoding; a retracted one re-prefilling in chunks too, one step over): its KV and one more
      decode step (``Scheduler.abort_request``: "will still run one decode forward pass"), up to
      ``kv_committed_len`` + :func:`decode_step_tokens`; otherwise (waiting, chunked, retracted, queued on a
      decode server): its prefill only, input plus output so far.
    - otherwise (waiting, chunked, running, retracted, queued on a decode server): its input plus
      ``max_new_tokens`` plus the speculative decode reserve (:func:`decode_reserve_tokens`), which bounds every
      prefill (input and output so far) and decode step (up to ``kv_committed_len`` + the step) of its life.

    A diffusion LLM request (:func:`dllm_block_tokens`) allocates a block past its prefix each round, ahead of the
    tokens it keeps: aborted, its KV or prefix plus one block (its last round); otherwise its input plus
    ``max_new_tokens`` less one (the most a round starts with, its prefix no longer) plus one block.
    """
    if req.finished():
        return 0
    block = dllm_block_tokens(req)
    if req.to_finish is None:
        total = len(req.origin_input_ids) + int(req.sampling_params.max_new_tokens or 0) + decode_reserve_tokens()
        if block:
            total += block - 1
    elif block:
        total = _held_tokens(req) + block
    else:
        total = len(req.origin_input_ids) + len(req.output_ids)
        if req.kv is not None and len(req.output_ids):
            total = max(total, req.kv_committed_len + decode_step_tokens())
    return -(-total // page_size) - foreign_prefix_pages(req, page_size)


def dllm_block_tokens(req):
    """The block of a diffusion LLM request (``req.dllm_config.block_size``), 0 for any other request. Each of its
    rounds extends its KV from its prefix by up to a block (``PrefillAdder._add_dllm_req``,
    ``add_dllm_staging_req``), masks included, and keeps only what it decodes: a round whose block the adder cut
    short (KV budget) leaves a prefix mid block, so the next round's block ends past the block grid."""
    config = getattr(req, "dllm_config", None)
    return 0 if config is None else int(config.block_size)


def decode_step_tokens():
    """Tokens one decode step may allocate beyond ``kv_committed_len``: 1 (``alloc_for_decode``), or with
    speculative decoding the reserve (``eagle_prepare_for_decode``)."""
    return decode_reserve_tokens() or 1


def held_pages(req, page_size):
    """Pages of ``req``'s sequence already counted in its tenant's owned pages: its KV (``kv_allocated_len``:
    running, chunked, preallocated on a decode server, a streaming session's restored slot) or its matched
    prefix (``prefix_indices``: the tenant's tree or session pages), whole and partial pages alike (the next
    token of an unaligned sequence goes into its held last page), less the pages of a prefix its tenant does not
    own (:func:`foreign_prefix_pages`, counted by neither side); 0 for a request that holds nothing yet (queued on
    a decode server)."""
    return max(0, -(-_held_tokens(req) // page_size) - foreign_prefix_pages(req, page_size))


def _held_tokens(req):
    """Tokens of ``req``'s KV (``kv_allocated_len``) or matched prefix, whichever is longer."""
    return max(len(req.prefix_indices), 0 if req.kv is None else req.kv.kv_allocated_len)


def worst_case_pages(req, page_size):
    """Pages ``req`` may still take beyond those its tenant already owns: :func:`request_pages` less
    :func:`held_pages` (each page counted once)."""
    return max(0, request_pages(req, page_size) - held_pages(req, page_size))
