"""Which tenant a request belongs to, from a source the serving gateway controls.

Trusted sources, in order: a header the gateway sets after authenticating the caller (its name is
configured server-side; the gateway must strip any client-sent copy), then a server-side map of API
keys to tenants. A request with neither goes to the default tenant. Nothing a client writes into
the request body is ever read.
"""

import json
import logging
import os
import re

logger = logging.getLogger(__name__)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/-]{0,255}$")


class TenantResolver:
    def __init__(self, header=None, api_keys=None, default_tenant="default"):
        self.header = header.lower() if header else None
        self._api_keys = dict(api_keys or {})
        for tenant in list(self._api_keys.values()) + [default_tenant]:
            _check_name(tenant, "tenant")
        self.default_tenant = default_tenant

    @classmethod
    def from_env(cls, env=None):
        """KVSHIELD_TENANT_HEADER, KVSHIELD_API_KEY_MAP (a JSON file: {"key": "tenant"}), KVSHIELD_DEFAULT_TENANT."""
        env = os.environ if env is None else env
        keys = {}
        path = env.get("KVSHIELD_API_KEY_MAP")
        if path:
            with open(path, encoding="utf-8") as f:
                keys = json.load(f)
            if not isinstance(keys, dict):
                raise ValueError(f"KVSHIELD_API_KEY_MAP {path} must hold a JSON object of api key -> tenant")
        return cls(env.get("KVSHIELD_TENANT_HEADER"), keys, env.get("KVSHIELD_DEFAULT_TENANT", "default"))

    def resolve(self, headers=None, api_key=None):
        """The tenant name for a request's gateway headers (a mapping) and authenticated API key."""
        if self.header and headers:
            for k, v in headers.items():
                if k.lower() == self.header and v:
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
        api_key = None
        for k, v in (headers or {}).items():
            if k.lower() == "authorization" and v and v.lower().startswith("bearer "):
                api_key = v[7:].strip()
        return self.resolve(headers, api_key)


def _check_name(name, what):
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{what}: tenant name {name!r} must match {_NAME.pattern}")
