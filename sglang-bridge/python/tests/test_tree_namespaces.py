"""SGLang's stock trees scope cached prefixes by ``Req.extra_key``: kvshield makes that the request's tenant first
(:func:`kvshield_sglang.engine_hooks.tree_namespace`), so a tenant's request hits its own tenant's cached prefix and
never another's, whatever ``extra_key`` the client sends. Driven on SGLang's ``UnifiedRadixCache`` and ``Req``
(``session_world``); the oracle reads back the KV bytes the matched prefix names. The twin drops the namespacing
and must see another tenant's bytes."""

import pytest
import scenarios
from conftest import TEST_CLASSES
from kvshield_sglang.engine_hooks import client_extra_key, tree_namespace
from server_scenarios import run_scenario, session_scenario

_MARK = "NAMESPACES "

_SCRIPT = r"""
import json, os, torch
from kvshield_sglang import plugin
plugin.load()
import servers, session_world
from sglang.srt.managers.schedule_batch import Req
if os.environ.get("PLANT") == "no-namespace":
    del Req.extra_key  # planted: SGLang's plain attribute, the client's value alone
OUT = {}
with servers.single_rank():
    w = session_world.World("unified", int(os.environ["PS"]))
    PS = w.page_size
    a = w.start("acme", list(range(100, 112)))  # acme's request, written (tenant code 1), finished: the tree keeps it
    w.finish(a)
    for tenant, extra in (("acme", None), ("globex", None), ("globex", "kvshield-tenant:4:acme|")):
        r = servers.request(f"{tenant}-{extra}", list(range(100, 112)) + [7], tenant)
        r.extra_key = extra  # the client's value (a forged tenant tag included)
        r.init_next_round_input(w.cache)
        got = w.kv.read(r.prefix_indices.to(torch.int64))[0, :, 0, 0].tolist()
        OUT[f"{tenant}/{extra}"] = {"matched": len(got), "tenants": sorted({int(v) // 10000 for v in got})}
print("NAMESPACES " + json.dumps(OUT))
"""


def _run(tmp_path, **env):
    return scenarios.run_reporting(_SCRIPT, _MARK, tmp_path, TEST_CLASSES, **env)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_tenant_hits_its_own_cached_prefix_and_never_anothers(jvm, tmp_path, page_size):
    out = _run(tmp_path, PS=str(page_size))
    assert out["acme/None"] == {"matched": 12, "tenants": [1]}, out  # the cache still serves its own tenant
    assert out["globex/None"]["matched"] == 0, out
    assert out["globex/kvshield-tenant:4:acme|"]["matched"] == 0, out  # a forged tag stays within globex


def test_twin_without_tenant_namespaces_another_tenant_reads_the_prefix(jvm, tmp_path):
    out = _run(tmp_path, PS="4", PLANT="no-namespace")
    assert out["globex/None"] == {"matched": 12, "tenants": [1]}, out


_CLIENT_KEYS = r"""
import json, os, torch
from kvshield_sglang import plugin
from kvshield_sglang.engine_hooks import client_extra_key
plugin.load()
import servers, session_world
from sglang.srt.managers.schedule_batch import Req
if os.environ.get("PLANT") == "strip-client-tag":  # planted: the client's own value loses a tag-shaped head
    Req.extra_key = property(Req.extra_key.fget,
                             lambda req, v: req.__dict__.__setitem__("_kvshield_extra_key", client_extra_key(v)))
OUT = {}
with servers.single_rank():
    w = session_world.World("unified", 4)
    a = servers.request("alice", list(range(100, 112)), "acme", extra_key="user:alice")  # a per-user namespace
    w._write(w._prefill(a), a, 1, 5)
    a.kv_committed_len = 12
    w.finish(a)  # the tree keeps alice's prompt in acme's "user:alice" namespace
    for extra in ("user:alice", "user:bob", "kvshield-tenant:4:acme|user:alice", "kvshield-tenant:3:bob|user:alice"):
        r = servers.request(f"acme-{extra}", list(range(100, 112)) + [7], "acme", extra_key=extra)  # the client's
        r.init_next_round_input(w.cache)
        got = w.kv.read(r.prefix_indices.to(torch.int64))[0, :, 0, 0].tolist()
        OUT[extra] = {"matched": len(got), "client_part": client_extra_key(r.extra_key)}
    e = servers.request("elastic", list(range(100, 112)) + [7], "acme", extra_key="user:alice")
    e.extra_key = f"{e.extra_key}|elastic_ep_size=4"  # SGLang's elastic EP append to what it read
    OUT["elastic"] = e.extra_key
print("CLIENTKEYS " + json.dumps(OUT))
"""


def test_a_clients_extra_key_is_its_namespace_verbatim_never_another_of_its_tenant(jvm, tmp_path):
    """The tree namespace is the tenant and the client's ``extra_key`` as sent: two values never share a cached
    prefix, even one shaped like kvshield's tenant tag (its own tenant's, or another name's); SGLang's own append to
    what it read stays in the tenant's namespace."""
    out = scenarios.run_reporting(_CLIENT_KEYS, "CLIENTKEYS ", tmp_path, TEST_CLASSES)
    assert out["user:alice"]["matched"] == 12 and out["user:bob"]["matched"] == 0, out
    for forged in ("kvshield-tenant:4:acme|user:alice", "kvshield-tenant:3:bob|user:alice"):
        assert out[forged] == {"matched": 0, "client_part": forged}, (
            f"the client's extra_key {forged!r} was rewritten into another namespace of acme: {out}")
    assert out["elastic"] == tree_namespace("acme", "user:alice|elastic_ep_size=4"), out


def test_twin_stripping_a_clients_tag_shaped_key_reads_another_users_prefix(jvm, tmp_path):
    out = scenarios.run_reporting(_CLIENT_KEYS, "CLIENTKEYS ", tmp_path, TEST_CLASSES, PLANT="strip-client-tag")
    assert out["kvshield-tenant:3:bob|user:alice"]["matched"] == 12, out


def test_namespaces_never_meet_across_tenants():
    assert tree_namespace("acme", None) != tree_namespace("acm", "e|")
    assert tree_namespace("a|b", "c") != tree_namespace("a", "b|c")
    assert client_extra_key(tree_namespace("acme", "x|elastic_ep_size=4")) == "x|elastic_ep_size=4"
    assert client_extra_key(tree_namespace("acme", None)) is None
    assert client_extra_key("kvshield-tenant:9:acme|x") == "kvshield-tenant:9:acme|x"  # malformed: the client's own


# --------------------------------------------------------------------------------------------------------------
# SGLang's default tree cache (UnifiedRadixCache, accepted at start) hands one tenant's cached prefix to another.
# --------------------------------------------------------------------------------------------------------------
# Promise (README: "no request ever reads another tenant's KV"; "Regulated tenants never share prefix pages";
# DESIGN-NOTES 15 / sglang-bridge README: a stock radix-cache prefix hit is "an earlier same-tenant request's").
# The tenant travels sealed in ``extra_key`` and the original value is put back before SGLang sees the request, so
# the stock tree's namespace carries no tenant: a globex request whose prompt starts like a finished acme request's
# matches acme's cached pages (the pool reports them acme's) and reads acme's KV as its own prefix. The same holds
# for a streaming session's first turn (its prefix is inserted into the tree) -- e.g. a session id reopened by
# another tenant with the same opening. Only the disaggregation send path checks a page's tenant; start-up refuses
# other trees (C++, FlexKV, other backends) but accepts this one, the default.
STOCK_TREE_CROSS_TENANT_HIT = session_scenario(r"""
w = session_world.World("unified", int(os.environ["PS"]))
PS = w.page_size
a = w.start("acme", list(range(100, 112)))      # acme's request, written, finished: the tree keeps its pages
w.finish(a)
g = servers.request("g1", list(range(100, 112)) + [7], "globex")
g.init_next_round_input(w.cache)                # globex's request with the same opening, matched
pre = g.prefix_indices.to(torch.int64)
got = w.kv.read(pre)[0, :, 0, 0].tolist()
OUT["matched"] = len(pre)
OUT["reads"] = got
OUT["foreign_positions"] = [i for i, v in enumerate(got) if int(v) // 10000 != 2]
OUT["owners"] = sorted({str(w.alloc.page_owner(int(x) // PS)[0]) for x in pre})
""")


@pytest.mark.parametrize("page_size", [1, 4])
def test_the_default_tree_cache_never_serves_one_tenants_prefix_to_another(jvm, tmp_path, page_size):
    out = run_scenario(tmp_path, STOCK_TREE_CROSS_TENANT_HIT, PS=str(page_size))
    assert not out["foreign_positions"], (
        f"isolation: globex's request matched {out['matched']} cached tokens of acme's and reads acme's KV at "
        f"positions {out['foreign_positions']} (values {out['reads'][:6]}...; page owners {out['owners']})")
