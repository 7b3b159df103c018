"""``python -m kvshield_sglang.launch_server <SGLang arguments>``.

Only sets kvshield up and then runs SGLang's own launcher with the same arguments: it exports the
rank directory and ``SGLANG_PLUGINS``-independent activation (the ``sglang.srt.plugins`` entry point
loads in every process SGLang spawns), runs the self-test, and execs ``python -m sglang.launch_server``.
"""

import os
import sys

from . import ranks


def command(argv):
    """The command the wrapper execs: SGLang's launcher, same interpreter, same arguments."""
    return [sys.executable, "-m", "sglang.launch_server", *argv]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    ranks.ensure_dir()
    from .selftest import main as self_test

    if self_test() != 0:
        return 1
    cmd = command(argv)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    sys.exit(main())
