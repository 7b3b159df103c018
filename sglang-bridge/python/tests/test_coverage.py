"""Every KV-holding tensor of a real SGLang pool is protected by kvshield, or the rank refuses to
start naming the pool class and the tensor (scenarios in ``coverage_world.py``, run in a
subprocess on the real upstream SGLang; see ``real_sglang.py``). Each planted-bug twin leaves one
tensor out and the byte oracle must name it. In-process, the pool's tensor scan: a slot-indexed tensor held in a
container (deque, set, namespace, a list holding itself) is refused naming it or scrubbed with the pool, and
``KVSHIELD_ACCEPT_GAPS`` takes exactly the gap names a refusal gives, refusing malformed ones."""

import types

import pytest

import real_sglang
from conftest import TEST_CLASSES, require_module, require_software
from coverage_cases import ISOLATION, REFUSALS, TWINS
from kvshield_sglang import buffers
from scenarios import fails, passes

require_module("torch")


@pytest.fixture(scope="module")
def world(jvm, tmp_path_factory):
    require_software(real_sglang.available(), f"the upstream SGLang snapshot at {real_sglang.UPSTREAM}")
    return real_sglang.run_world("coverage_world", tmp_path_factory.mktemp("ranks"), TEST_CLASSES)


@pytest.mark.parametrize("name", sorted(ISOLATION))
def test_every_tensor_of_the_pool_is_zero_or_sealed_when_the_next_tenant_gets_its_pages(world, name):
    passes(world, f"isolation/{name}")


@pytest.mark.parametrize("name", sorted(TWINS))
def test_twin_registering_all_but_one_tensor_is_caught_naming_it(world, name):
    fails(world, f"twin/{name}", TWINS[name][3])


@pytest.mark.parametrize("name", REFUSALS)
def test_sglang_pool_construction_is_covered_or_refused(world, name):
    passes(world, name)


def test_every_scenario_is_asserted(world):
    assert set(world) == ({f"isolation/{n}" for n in ISOLATION} | {f"twin/{n}" for n in TWINS} | set(REFUSALS))


def _holder(kind, tensor):
    import collections

    import torch

    if kind == "deque":
        return collections.deque([tensor])
    if kind == "set":
        return {tensor}
    if kind == "namespace":
        return types.SimpleNamespace(buffer=tensor)
    if kind == "nn-module":
        m = torch.nn.Module()
        m.register_buffer("cache", tensor)
        return m
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["deque", "set", "namespace", "nn-module"])
def test_a_slot_indexed_tensor_held_in_another_container_is_refused_naming_it(jvm, kind):
    """buffers.py / README: every tensor a KV pool instance holds must be registered, a view inside a registered
    buffer, empty or declared; "anything else is refused naming it" (unknown-tensor:Class.attribute). A real
    SGLang MHATokenToKVPool (the tests' CPU subclass, enumerated as that class) holding one more KV-shaped tensor,
    one row per token slot like k_buffer, must stop the allocator at start naming the attribute. Held in a deque,
    a set, a SimpleNamespace or a torch.nn.Module (not a list, tuple, dict or SGLang object), it is never seen:
    the allocator opens, registers the 4 K/V buffers only, and that tensor's bytes are never scrubbed."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import UnsupportedFeatureError

    pool = MHAPool(32, 4)
    rows = pool.k_buffer[0].shape[0]
    pool.extra_kv = _holder(kind, torch.ones(rows, 4))  # one KV row per token slot, as k_buffer[i]
    _, refusals = buffers.cover([pool], 32, 4)
    assert any("extra_kv" in r.where for r in refusals), f"no refusal names extra_kv: {refusals}"
    with pytest.raises(UnsupportedFeatureError, match="extra_kv"):
        PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                    kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})


def test_released_page_of_a_namespace_held_kv_tensor_is_not_left_with_its_bytes(jvm):
    """Scrub at ZERO (README): a released page's bytes are zero before another tenant gets it, in every tensor
    that holds KV at the pool's slots. The same pool as above, its extra KV tensor held in a SimpleNamespace:
    the allocator opens (it should have refused), and after t1's page is released and the step ends, K/V read
    back zero at its slots while the extra tensor still holds t1's bytes there."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator

    pool = MHAPool(32, 4)
    rows = pool.k_buffer[0].shape[0]
    extra = torch.zeros(rows, 4)
    pool.extra_kv = types.SimpleNamespace(buffer=extra)
    try:
        a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                        kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    except Exception as e:  # the promised outcome: refused at start, naming it
        assert "extra_kv" in str(e)
        return
    a.set_plan([("A", "t1", 0, 4)])
    slots = a.alloc(4)
    a.clear_plan()
    for b in pool.buffers():
        b[slots] = 7.0
    extra[slots] = 7.0
    with a.releasing("t1", "A"):
        a.free(slots)
    a.end_step()
    assert all(bool((b[slots] == 0).all()) for b in pool.buffers()), "K/V were not scrubbed"
    assert bool((extra[slots] == 0).all()), f"t1's KV bytes survive release in extra_kv: {extra[slots].tolist()}"


@pytest.mark.parametrize("raw", ["unknown-pool:", "unknown-tensor:", "unknown-tensor:MHATokenToKVPool",
                                 "unknown-tensor:.k_buffer"])
def test_malformed_gap_names_are_refused_naming_them(raw):
    """README: KVSHIELD_ACCEPT_GAPS accepts memory kvshield does not cover "by name": the GAPS names,
    ``unknown-pool:Class``, ``unknown-tensor:Class.attribute`` or ``all``; an unknown name raises naming it
    (accepted_gaps: "unknown gap(s) ... in KVSHIELD_ACCEPT_GAPS"). A name with the prefix but no class, or no
    attribute, names no gap kvshield could ever report; it must be refused as the unknown names are, naming it.
    Observed: accepted silently (an operator's typo accepts nothing and is never reported)."""
    with pytest.raises(ValueError, match="KVSHIELD_ACCEPT_GAPS"):
        got = buffers.accepted_gaps({"accept_gaps": raw})
        pytest.fail(f"{raw!r} accepted as {got}")


def test_the_gap_name_a_refusal_names_for_a_tensor_in_a_set_is_accepted(jvm):
    """README / buffers.settle: a refusal ends "To run with this memory unprotected, set KVSHIELD_ACCEPT_GAPS=<gap>";
    setting exactly that must start the allocator with the gap accepted. The tensor scan now follows sets (paths
    ``attr{i}``), and the unknown-tensor name keeps that ``{i}``, which the new well-formedness check in
    accepted_gaps refuses: the operator's only documented way past the refusal raises "unknown gap(s)"."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import UnsupportedFeatureError

    pool = MHAPool(32, 4)
    pool.scratch = {torch.ones(5)}  # a tensor the pool holds in a set: memory kvshield has not enumerated
    settings = {"level": "ZERO", "advertisedContextTokens": 32}
    with pytest.raises(UnsupportedFeatureError) as e:
        PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False, kvshield_settings=dict(settings))
    hint = str(e.value).split("KVSHIELD_ACCEPT_GAPS=", 1)[1].split()[0]
    assert hint.startswith("unknown-tensor:MHAPool.scratch"), hint
    try:
        a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                        kvshield_settings=dict(settings, accept_gaps=hint))
    except ValueError as err:
        pytest.fail(f"the gap the refusal named ({hint!r}) is refused by KVSHIELD_ACCEPT_GAPS: {err}")
    assert a is not None


def test_a_pool_holding_a_self_referencing_list_is_refused_not_crashed(jvm):
    """buffers._tensors_of: "each object once" -- the scan guards objects against cycles but not the lists, deques
    and dicts it follows, so a pool holding a container that contains itself (a history list, a deque of pending
    work pointing back at its owner's list) recurses until RecursionError: start-up crashes with no named refusal
    (fail closed with named values). Promised: either the allocator starts (no tensor there) or a named
    UnsupportedFeatureError."""
    import torch

    from fakes import MHAPool
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator
    from kvshield_sglang.errors import UnsupportedFeatureError

    pool = MHAPool(32, 4)
    pool.history = []
    pool.history.append(pool.history)
    try:
        a = PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cpu", pool, False,
                                        kvshield_settings={"level": "ZERO", "advertisedContextTokens": 32})
    except UnsupportedFeatureError as e:
        assert "history" in str(e)
        return
    except RecursionError:
        pytest.fail("start-up crashed with RecursionError scanning a self-referencing list the pool holds")
    assert a.page_size == 4
