"""Start-up self-test: ``python -m kvshield_sglang.selftest``.

Checks the Java runtime (25+), the kvshield jars, ``--enable-native-access``, and prints versions.
Exit status 0 when the bridge can run, 1 otherwise (the reason on stderr).
"""

import sys

from .errors import KvShieldError


def main():
    try:
        from . import runtime

        lines, problems = runtime.self_test()
    except KvShieldError as e:
        print(f"kvshield self-test: FAILED: {e}", file=sys.stderr)
        return 1
    for line in lines:
        print(line)
    for p in problems:
        print(f"PROBLEM: {p}", file=sys.stderr)
    print("kvshield self-test: " + ("ok" if not problems else "FAILED"))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
