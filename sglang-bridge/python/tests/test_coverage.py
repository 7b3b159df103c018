"""Every KV-holding tensor of a real SGLang pool is protected by kvshield, or the rank refuses to
start naming the pool class and the tensor (scenarios in ``coverage_world.py``, run in a
subprocess on the real upstream SGLang; see ``real_sglang.py``). Each planted-bug twin leaves one
tensor out and the byte oracle must name it."""

import pytest

import real_sglang
from conftest import TEST_CLASSES, require_module, require_software
from coverage_cases import ISOLATION, REFUSALS, TWINS
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
