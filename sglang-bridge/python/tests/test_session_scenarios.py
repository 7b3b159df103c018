"""Streaming-session scenarios on the real SGLang (:mod:`session_world`): two tenants' streaming sessions over
several turns, interleaved with the other tenant's plain requests in a small pool, every session's kept KV and
every turn's history read back after every step; a request naming another tenant's session refused; the
orphaned tail freed at a match, a mid-turn abort and each session's close freed as the session's, a turn SGLang
detached from its session refused the session's KV, nothing leaked. The planted-bug twins (a turn's release no
longer leaves the kept KV the session's; a detached turn still frees as the session) must fail the content
oracle."""

import pytest

import scenarios
from conftest import TEST_CLASSES

MAIN = ["sessions-unified-p1", "sessions-unified-p4", "sessions-chunk-p4"]


@pytest.fixture(scope="module")
def world(jvm, tmp_path_factory):
    return scenarios.run_world("session_world", tmp_path_factory.mktemp("sessions"), TEST_CLASSES,
                               KVSHIELD_ADVERTISED_CONTEXT_TOKENS="64")


@pytest.mark.parametrize("name", MAIN)
def test_streaming_sessions_read_back_only_their_own_kv_across_turns_and_leak_nothing(world, name):
    scenarios.passes(world, name)


@pytest.mark.parametrize("name", ["twin-session-kv-released-unified-p4", "twin-detached-turn-still-serves-unified-p4"])
def test_twin_planted_bug_is_caught_by_the_content_oracle(world, name):
    scenarios.fails(world, name, "isolation")
