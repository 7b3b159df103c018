"""The decode sweep's acknowledgements and expiries are agreed across ranks before they act: two gloo
ranks whose transports and clocks disagree take the same decisions (concluded on every rank: acknowledge;
deadline passed on some rank: expire); the twin, sweeping without the group, diverges."""

import json
import os
import subprocess
import sys

from conftest import require_module

torch = require_module("torch")
HERE = os.path.dirname(os.path.abspath(__file__))
RANK = """
import json, sys
import torch.distributed as dist
from kvshield_sglang import disagg
rank, init, flags, agree = int(sys.argv[1]), sys.argv[2], json.loads(sys.argv[3]), sys.argv[4] == "agree"
dist.init_process_group("gloo", init_method="file://" + init, rank=rank, world_size=2)
group = dist.new_group([0, 1], backend="gloo")

class Adapter:  # this rank's transport: which rooms it has seen concluded
    def acknowledged(self, receiver):
        return flags[receiver]

class Handoff:  # the decode side's bookkeeping, as the hooks keep it; records what the sweep decided
    def __init__(self):
        self.inflight = {f"r{i}": disagg._InFlight(i, Adapter()) for i in range(len(flags))}
        self.acknowledged, self.expired = [], []
    def acknowledge(self, rid):
        self.acknowledged.append(rid)
    def has_reservation(self, rid):
        return True
    def expire(self, rid):
        self.expired.append(rid)

h = Handoff()
for e in h.inflight.values():  # every transfer was given up on; only rank 0's clock is past the deadline
    e.given_up_at = 0.0 if rank == 0 else 1e18
disagg.sweep(h, group if agree else None, now=1e9)
print(json.dumps([h.acknowledged, h.expired]))
dist.destroy_process_group()
"""


def _two_ranks(tmp_path, flags, agree=True):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(HERE))
    init = str(tmp_path / "rendezvous")
    procs = [subprocess.Popen([sys.executable, "-c", RANK, str(r), init, json.dumps(flags[r]), "agree" if agree else "local"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
        outs.append(json.loads(out.strip().splitlines()[-1]))
    return outs


LOCAL = [[True, True, False], [True, False, True]]


def test_two_ranks_acknowledge_and_expire_the_same_transfers(tmp_path):
    (acked0, expired0), (acked1, expired1) = _two_ranks(tmp_path, LOCAL)
    assert acked0 == acked1 == ["r0"], "acknowledge only what every rank saw concluded"
    assert expired0 == expired1 == ["r1", "r2"], "expire what some rank's deadline passed, on every rank"


def test_twin_sweeping_on_local_observations_diverges(tmp_path):
    (acked0, expired0), (acked1, expired1) = _two_ranks(tmp_path, LOCAL, agree=False)
    assert (acked0, expired0) != (acked1, expired1), "without agreement the ranks' pools change at different calls"


def test_without_a_group_the_local_flags_stand():
    from kvshield_sglang import consensus

    assert consensus.every_rank([1, 0], None) == [True, False]
    assert consensus.any_rank([], object()) == []
