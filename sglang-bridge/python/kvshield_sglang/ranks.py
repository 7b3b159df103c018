"""Active on every rank or not at all.

Every scheduler process (tensor-parallel rank, data-parallel replica) writes one record into a
directory its launcher chose (``$KVSHIELD_RANK_DIR``, inherited by the processes SGLang spawns):
active with its versions, or inactive with the reason. Before serving, the launching process
checks that every expected rank reported active, and refuses to serve naming the ranks that did
not. An active record whose writer ran on this host and has exited is an earlier boot's (a reused
directory) and vouches for nobody; a remote host's records cannot be asked.
"""

import json
import os
import socket
import tempfile
import time

from .errors import RankNotProtectedError

ENV_DIR = "KVSHIELD_RANK_DIR"


def ensure_dir():
    """The rank directory, created (and exported for child processes) if unset."""
    d = os.environ.get(ENV_DIR)
    if not d:
        d = tempfile.mkdtemp(prefix="kvshield-ranks-")
        os.environ[ENV_DIR] = d
    os.makedirs(d, mode=0o700, exist_ok=True)
    # NOTE: whoever can write here can plant an active record (the gate then vouches for a rank without kvshield) or
    # the tenant channel's key: a directory others may write is refused, naming it
    mode = os.stat(d).st_mode & 0o777
    if mode & 0o022:
        raise PermissionError(f"{ENV_DIR} {d} is writable by users other than its owner (mode {oct(mode)}): anyone who"
                              " can write there can vouch for a rank; make it owner-only (chmod 700)")
    return d


def rank_name(tp_rank=0, dp_rank=0, pp_rank=0):
    return f"tp{tp_rank}-dp{dp_rank}-pp{pp_rank}"


def server_of(server_args):
    """The server a rank serves, as its scheduler and the launcher's gate both tell it from SGLang's server args: the
    rendezvous address every node of one multi-node server shares, else this host and the server's port (two servers
    on one host cannot share it); None without them (a record is then not told apart by its server)."""
    addr = getattr(server_args, "dist_init_addr", None)
    if addr:
        return f"dist-init-addr {addr}"
    port = getattr(server_args, "port", None)
    return None if port is None else f"{socket.gethostname()}:{port}"


def report(name, active, detail, directory=None, hooks=None, problems=(), server=None):
    """Records this process's rank atomically: active (kvshield's allocator and every hook in place) or
    not, with each hook's outcome and the problems that make it inactive, and the server it serves (:func:`server_of`)."""
    d = directory or ensure_dir()
    path = os.path.join(d, f"rank-{name}.json")
    tmp = path + f".{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"rank": name, "active": bool(active), "pid": os.getpid(), "started": _start_time(os.getpid()),
                   "host": socket.gethostname(), "detail": detail, "hooks": dict(hooks or {}),
                   "problems": list(problems), "server": server}, f)
    os.replace(tmp, path)
    return path


def expected_ranks(tp_size=1, dp_size=1, pp_size=1, dp_attention=False):
    """Every scheduler process SGLang starts: ``dp_size`` replicas of ``tp_size × pp_size`` ranks, or with
    data-parallel attention ``tp_size × pp_size`` ranks whose data-parallel rank SGLang derives from the
    tensor-parallel rank (``compute_dp_attention_world_info``: ``tp // (tp_size // dp_size)``)."""
    if dp_attention:
        per_dp = tp_size // dp_size
        return [rank_name(t, t // per_dp, p) for p in range(pp_size) for t in range(tp_size)]
    return [rank_name(t, d, p) for d in range(dp_size) for p in range(pp_size) for t in range(tp_size)]


def _start_time(pid):
    """A process's start time in clock ticks since boot (Linux ``/proc``), or None where it cannot be read."""
    try:
        with open(f"/proc/{int(pid)}/stat", encoding="ascii") as f:
            return int(f.read().rsplit(")", 1)[1].split()[19])  # NOTE: field 22; the name before ")" may hold spaces
    except (OSError, ValueError, IndexError):
        return None


def _writer_exited(record):
    """Whether the process that wrote ``record`` ran on this host and has exited (a remote one cannot be asked):
    no process has its pid, or the one that has it started at another time (the pid was reused)."""
    if record.get("host") != socket.gethostname():
        return record.get("host") is None  # NOTE: a record without its host predates this check: not this boot's
    try:
        pid = int(record.get("pid", -1))
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, OverflowError):
        return False
    started = _start_time(pid)
    return started is not None and started != record.get("started")


def verify(expected, directory=None, timeout_s=0.0, poll_s=0.05, server=None):
    """Returns the records of every expected rank, or raises RankNotProtectedError naming the ranks
    that reported inactive or did not report within ``timeout_s``. With ``server`` (:func:`server_of`), a record
    another server's rank wrote (a rank directory two servers were given) vouches for nobody here."""
    d = directory or os.environ.get(ENV_DIR)
    if not d:
        raise RankNotProtectedError(f"{ENV_DIR} is not set: no rank can have reported kvshield active")
    deadline = time.monotonic() + timeout_s
    while True:
        records, missing, inactive, foreign = {}, [], [], {}
        for name in expected:
            try:
                with open(os.path.join(d, f"rank-{name}.json"), encoding="utf-8") as f:
                    record = json.load(f)
            except (OSError, ValueError):
                missing.append(name)
                continue
            if record.get("active") and _writer_exited(record):  # NOTE: an earlier boot's, in a reused directory
                missing.append(name)
            elif server is not None and record.get("server") != server:
                foreign[name] = record.get("server")
            else:
                records[name] = record
        inactive = [n for n, r in records.items() if not r.get("active")]
        if not missing and not inactive and not foreign:
            return records
        if time.monotonic() >= deadline:
            parts = [f"rank {n} runs without kvshield ({records[n].get('detail')}): "
                     + "; ".join(records[n].get("problems") or ["reported inactive"]) for n in inactive]
            parts += [f"rank {n} never reported kvshield active in this boot (plugin not loaded in that process?)"
                      for n in missing]
            parts += [f"rank {n} never reported for this server ({server}): its record in {d} is server {s}'s (give"
                      " each server its own rank directory)" for n, s in foreign.items()]
            raise RankNotProtectedError("refusing to serve: " + "; ".join(parts))
        time.sleep(poll_s)
