"""kvshield's settings read exactly or refused naming the setting, on the real SGLang: each case a misconfiguration
found by attack that left a server running weaker than configured, with nothing said."""

import json

import pytest


def _open(**settings):
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    return PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", MHAPool(32, 4), False,
                                       kvshield_settings={"advertisedContextTokens": 32, **settings})


@pytest.mark.parametrize("value, shown", [("COMPLIANCE\x01", "'COMPLIANCE\\u0001'"),
                                          ("\x1fCOMPLIANCE", "'\\u001fCOMPLIANCE'"),
                                          ("COMPL\u0131ANCE", "'COMPL\\u0131ANCE'")])
def test_a_level_the_pool_would_read_as_compliance_is_refused_by_the_pool_and_the_handoff_fix_check(jvm, monkeypatch,
                                                                                                    value, shown):
    """disagg.check_handoff_fix: under COMPLIANCE, an SGLang without the handoff-isolation fix refuses to start. The
    pool read KVSHIELD_LEVEL with Java's trim() (every character up to U+0020, control characters included) and
    toUpperCase (dotless ``ı`` to ``I``); the hook with Python's strip() (whitespace only): "COMPLIANCE\\x01" ran the
    pool at COMPLIANCE (it demanded the audit trail's key) while the hook saw another level and let the rank start
    on the unfixed SGLang. Both now read the level one way, exactly, and refuse this value naming it escaped."""
    from kvshield_sglang import disagg, plugin
    from kvshield_sglang.errors import KvShieldError

    monkeypatch.delenv(disagg.ALLOW_UNFIXED, raising=False)
    monkeypatch.setenv("KVSHIELD_LEVEL", value)
    assert not disagg.has_handoff_fix(), "this snapshot's create_sender has only the KV-capacity check"
    with pytest.raises((KvShieldError, ValueError)) as pool:
        _open()
    assert "COMPLIANCE writes a signed audit trail" not in str(pool.value), "the pool runs this value as COMPLIANCE"
    assert (f"level must be one of [NONE, ZERO, ENCRYPT, COMPLIANCE]: {shown}" in str(pool.value)
            or str(pool.value) == f"KVSHIELD_LEVEL holds a control character: {shown}"), str(pool.value)
    with pytest.raises(ValueError) as hook:
        plugin._install_disagg("check_handoff_fix")(None)
    assert str(hook.value) == f"KVSHIELD_LEVEL must be one of ['NONE', 'ZERO', 'ENCRYPT', 'COMPLIANCE']: {shown}"


def test_a_level_between_the_blanks_an_env_file_leaves_is_read_alike_by_both(jvm, monkeypatch):
    from kvshield_sglang import disagg
    from kvshield_sglang.errors import KvShieldError, UnsupportedFeatureError

    monkeypatch.delenv(disagg.ALLOW_UNFIXED, raising=False)
    monkeypatch.setenv("KVSHIELD_LEVEL", " compliance\r\n")
    with pytest.raises(KvShieldError, match="COMPLIANCE writes a signed audit trail"):
        _open()
    with pytest.raises(UnsupportedFeatureError, match="COMPLIANCE refuses to start"):
        disagg.check_handoff_fix()


@pytest.mark.parametrize("variable", ["KVSHIELD_LEVEL", "KVSHIELD_AUDIT_DIR", "KVSHIELD_AUDIT_SHIP", "KVSHIELD_STRICT",
                                      "KVSHIELD_DEFAULT_TENANT", "KVSHIELD_QUARANTINE"])
def test_a_setting_given_empty_is_refused_naming_it_not_read_as_its_default(jvm, monkeypatch, tmp_path, variable):
    """README's settings table: each variable's default applies when it is not set. One set but empty (an env file's
    ``KVSHIELD_LEVEL=``, a template whose value did not render) was dropped as if unset: the pool ran ZERO for an
    empty level, without its audit trail for an empty KVSHIELD_AUDIT_DIR (with KVSHIELD_AUDIT_SIGNING_KEY empty
    too), the other settings at their defaults; nothing said so. Refused now, naming the variable."""
    monkeypatch.setenv(variable, "")
    with pytest.raises(ValueError) as e:
        a = _open()
        pytest.fail(f"{variable}='' opened a pool (audited: {a._audited}, level {a._jalloc.pool().config().level()})")
    assert str(e.value) == f"{variable} is set but empty: give it a value or leave it unset"


def test_an_empty_setting_twin_the_pool_opens_at_the_default_without_the_check(jvm, monkeypatch):
    """Twin: with settings_from_env dropping empty variables again (the bug), the oracle above fails: the pool opens."""
    import os

    from kvshield_sglang import allocator

    monkeypatch.setenv("KVSHIELD_LEVEL", "")
    monkeypatch.setattr(allocator, "settings_from_env",
                        lambda overrides=None: {**{k: os.environ[e] for k, e in allocator._ENV.items() if os.environ.get(e)},
                                                **{k: str(v) for k, v in (overrides or {}).items()}})
    a = _open()
    assert str(a._jalloc.pool().config().level()) == "ZERO" and not a._audited


def _resolver(env, tmp_path, keys=None):
    from kvshield_sglang.tenants import TenantResolver

    env = dict(env)
    if keys is not None:
        path = tmp_path / "keys.json"
        path.write_text(keys)
        env["KVSHIELD_API_KEY_MAP"] = str(path)
    return TenantResolver.from_env(env)


# (settings, key map file, request headers, the tenant the request got while the settings were accepted, refusal)
WEAKENED = {
    "empty header": ({"KVSHIELD_TENANT_HEADER": ""}, None, {"x-tenant": "acme"}, "default",
                     "KVSHIELD_TENANT_HEADER is set but empty"),
    "look-alike hyphen": ({"KVSHIELD_TENANT_HEADER": "X\u2011Tenant"}, None, {"x-tenant": "acme"}, "default",
                          "KVSHIELD_TENANT_HEADER must be an HTTP header name (RFC 9110 token characters): no request"
                          " could carry 'X\\u2011Tenant'"),
    "empty api key": ({}, '{"": "acme", "sk-2": "globex"}', {"authorization": "Bearer "}, "acme",
                      "api key(s) number [1] (not shown) are empty"),
    "padded api key": ({}, '{" sk-1": "acme"}', {"authorization": "Bearer sk-1"}, "default",
                       "api key(s) number [1] (not shown) are empty or hold blanks"),
    "key listed twice": ({}, '{"sk-1": "acme", "sk-1": "globex"}', {"authorization": "Bearer sk-1"}, "globex",
                         "key number 2 (not shown) is listed twice"),
    "default is a keyed tenant": ({"KVSHIELD_DEFAULT_TENANT": "acme"}, '{"sk-1": "acme"}', {}, "acme",
                                  "KVSHIELD_DEFAULT_TENANT 'acme' is a tenant KVSHIELD_API_KEY_MAP gives api keys to"),
    "empty map": ({"KVSHIELD_TENANT_HEADER": "X-Tenant"}, "{}", {"authorization": "Bearer sk-1"}, "default",
                  "must hold a JSON object of api key -> tenant, at least one"),
}


@pytest.mark.parametrize("case", sorted(WEAKENED))
def test_tenant_settings_that_would_resolve_requests_to_the_wrong_tenant_are_refused(tmp_path, case):
    """README: the tenant is the gateway's header or the request's bearer API key in the server-side map, else the
    default tenant. Each of these settings was accepted and resolved requests to a tenant they are not: an empty or
    unmatchable header name (a look-alike hyphen) left every request on the default tenant; a map key that is empty
    gave an anonymous ``Authorization: Bearer `` acme's tenant, a padded one never matched its client's token; a key
    listed twice went to the last tenant; a default tenant the map gives keys to made every keyless request that
    tenant's (its cached prefixes with it). Each is refused at start now, naming the setting, never a key."""
    env, keys, _, _, refusal = WEAKENED[case]
    with pytest.raises(ValueError) as e:
        _resolver(env, tmp_path, keys)
    assert refusal in str(e.value), str(e.value)
    assert "sk-1" not in str(e.value) and "sk-2" not in str(e.value), str(e.value)


@pytest.mark.parametrize("case", sorted(WEAKENED))
def test_tenant_settings_twin_the_resolver_built_from_them_gives_the_wrong_tenant(tmp_path, case):
    """Twin: the resolver these settings built before (its constructor, no check) hands the request the wrong tenant,
    so the refusal above is what stands between them and a request run as another tenant."""
    from kvshield_sglang.tenants import TenantResolver

    env, keys, headers, wrong, _ = WEAKENED[case]
    pairs = json.loads(keys or "{}", object_pairs_hook=lambda p: dict(p))
    r = TenantResolver(env.get("KVSHIELD_TENANT_HEADER"), pairs, env.get("KVSHIELD_DEFAULT_TENANT", "default"))
    assert r.resolve_http(headers) == wrong


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_a_key_map_other_users_may_write_is_refused_naming_it(tmp_path, mode):
    """The key map is every tenant's credentials: whoever may write it gives their own key any tenant. A map writable by
    its group or by anyone is refused at start, naming the file and mode, never a key; the same map writable by its
    owner alone (0644, 0600: a Kubernetes secret mounts 0644) is read."""
    path = tmp_path / "keys.json"
    path.write_text('{"sk-1": "acme"}')
    path.chmod(mode)
    with pytest.raises(ValueError) as e:
        _resolver({"KVSHIELD_API_KEY_MAP": str(path)}, tmp_path)
    assert f"KVSHIELD_API_KEY_MAP {path} (mode {oct(mode)}) is writable by other users" in str(e.value), str(e.value)
    assert "sk-1" not in str(e.value), str(e.value)
    for readable in (0o644, 0o600):
        path.chmod(readable)
        assert _resolver({"KVSHIELD_API_KEY_MAP": str(path)}, tmp_path).resolve_http({"authorization": "Bearer sk-1"}) \
            == "acme"


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "1e3", "\u0665", ""])
def test_a_transfer_deadline_that_never_passes_or_is_not_a_number_refuses_the_start(monkeypatch, value):
    """KVSHIELD_HANDOFF_ACK_TIMEOUT_S / KVSHIELD_PREFILL_SEND_TIMEOUT_S: a handoff given up on, or a send not
    concluded, this long is expired (claims fenced, alarmed). Read with float() at every step: ``nan`` and ``inf``
    made the deadline never pass (no fence, no alarm, nothing said), a value that is not a number raised inside the
    scheduler's step loop, after the server had started. Refused at start (the disaggregation hooks' install) now."""
    from kvshield_sglang import disagg, disagg_prefill, settings

    for name in (disagg.ACK_TIMEOUT, disagg_prefill.SEND_TIMEOUT):
        monkeypatch.setenv(name, value)
        with pytest.raises(ValueError, match=f"^{name} (must be a number of seconds >= 0|is set but empty)"):
            settings.seconds(name, 60)
        monkeypatch.setenv(name, "0")
        assert settings.seconds(name, 60) == 0.0
        monkeypatch.delenv(name)
        assert settings.seconds(name, 60) == 60.0
    monkeypatch.setenv(disagg.ACK_TIMEOUT, value)
    with pytest.raises(ValueError, match=disagg.ACK_TIMEOUT):
        disagg.install_decode()


@pytest.mark.parametrize("value, refusal", [("", "KVSHIELD_SHARED_PREFIX_TENANT is set but empty"),
                                            ("ac me", "KVSHIELD_SHARED_PREFIX_TENANT: tenant name 'ac me' must match")])
def test_a_shared_prefix_tenant_no_tenant_can_be_is_refused(monkeypatch, value, refusal):
    """KVSHIELD_SHARED_PREFIX_TENANT names the tenant whose prefixes every non-regulated tenant may hit. It was taken
    as given: set empty it was silently off, set to a name no tenant can have it named nobody. Refused now."""
    from kvshield_sglang import prefix_cache

    monkeypatch.setenv("KVSHIELD_SHARED_PREFIX_TENANT", value)
    with pytest.raises(ValueError) as e:
        prefix_cache._factory(None)
    assert str(e.value).startswith(refusal), str(e.value)



def _bytes_handed_on(**settings):
    """acme's request writes 7.0 into its 8 slots and releases them; at the next step globex's request takes the
    whole pool: the KV bytes (every K and V buffer of SGLang's pool) it is handed at acme's former slots."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from trail_tools import NamedRequest

    kv = MHAPool(32, 4)
    a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", kv, False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32, **settings})
    acme, globex = NamedRequest("acme-1"), NamedRequest("globex-1")
    a.set_plan([(acme, "acme", 0, 8)])
    slots = a.alloc(8)
    a.clear_plan()
    for b in kv.buffers():
        b[slots] = 7.0
    with a.releasing("acme", acme):
        a.free(slots)
    a.end_step()
    a.set_plan([(globex, "globex", 0, 32)])
    got = a.alloc(32)
    a.clear_plan()
    assert set(slots.tolist()) <= set(got.tolist()), (slots, got)
    return kv.read(slots)


def test_a_backend_that_protects_memory_of_its_own_is_refused_over_sglangs_kv(jvm):
    """README: KVSHIELD_BACKEND names the page-memory backend (default cpu-external, cuda for CUDA tensors). Set to
    cpu-offheap (the simulations' backend) over SGLang's KV buffers, the pool scrubbed memory of its own: under ZERO
    globex's request was handed acme's KV bytes unscrubbed, while the rank reported itself protected. Refused now,
    naming the setting; the default backend hands the same slots on zeroed."""
    from kvshield_sglang.errors import UnsupportedFeatureError

    assert _bytes_handed_on().abs().sum() == 0, "the default backend handed acme's KV to globex"
    with pytest.raises(UnsupportedFeatureError, match="^KVSHIELD_BACKEND cpu-offheap keeps the pool's pages in memory"):
        _bytes_handed_on(backend="cpu-offheap")


def test_a_backend_of_its_own_twin_hands_acmes_bytes_to_globex(jvm, monkeypatch):
    """Twin: without the refusal (the bug), the same oracle reads acme's 7.0s in what globex was handed."""
    from kvshield_sglang import allocator

    monkeypatch.setattr(allocator, "check_backend", lambda backend: None)
    assert (_bytes_handed_on(backend="cpu-offheap") == 7.0).all()
