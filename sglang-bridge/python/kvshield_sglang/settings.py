"""Reading kvshield's environment settings exactly: a value is what it says or it is refused naming the variable.

The rules the Java side (``BridgeSettings``) applies to the settings it parses, for the ones Python reads itself: the
blanks an env file leaves around a value (space, tab, CR, LF) are dropped and nothing else; a value set but empty is
refused, never read as its default (``KVSHIELD_LEVEL=`` from a template would otherwise run ZERO); a control
character or a look-alike letter is refused, never folded into the name it resembles.
"""

import math
import os
import re

_BLANKS = " \t\r\n"
LEVELS = ("NONE", "ZERO", "ENCRYPT", "COMPLIANCE")


def shown(value):
    """``value`` quoted for a refusal, every character outside printable ASCII as ``\\uXXXX`` (as Java shows it)."""
    return "'" + "".join(c if 0x20 <= ord(c) < 0x7f else f"\\u{ord(c):04x}" for c in value) + "'"


def get(name, env=None):
    """The unpadded value of environment variable ``name``, or None when unset; refuses one set but empty, or
    holding a control character (shown escaped: never pass a key's own variable)."""
    value = (os.environ if env is None else env).get(name)
    if value is None:
        return None
    v = value.strip(_BLANKS)
    if not v:
        raise ValueError(f"{name} is set but empty: give it a value or leave it unset")
    if any(ord(c) < 0x20 or ord(c) == 0x7f for c in v):
        raise ValueError(f"{name} holds a control character: {shown(value)}")
    return v


def level(value, name="KVSHIELD_LEVEL"):
    """The protection level ``value`` names (ASCII letters in any case, unpadded), as the Java settings read it."""
    v = value.strip(_BLANKS)
    if re.fullmatch(r"[A-Za-z]+", v) and v.upper() in LEVELS:
        return v.upper()
    raise ValueError(f"{name} must be one of {list(LEVELS)}: {shown(value)}")


def seconds(name, default, env=None):
    """A duration setting in seconds: a finite number >= 0 (ASCII), else refused naming it; ``default`` when unset.
    ``nan`` or ``inf`` would make the deadline it sets never pass, silently."""
    v = get(name, env)
    if v is None:
        return float(default)
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", v) or not math.isfinite(float(v)):
        raise ValueError(f"{name} must be a number of seconds >= 0: {shown(v)}")
    return float(v)
