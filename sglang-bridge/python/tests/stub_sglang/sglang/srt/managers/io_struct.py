"""Stand-in for SGLang's request structs (``python/sglang/srt/managers/io_struct.py``), pickled between
processes. ``TokenizedGenerateReqInput`` comes in both shapes SGLang has shipped: a dataclass (older
versions; takes extra attributes) and, with ``SGLANG_STUB_IO_STRUCT=msgspec``, a ``msgspec.Struct``
(current versions: fixed fields, no ``__dict__``); without msgspec installed, a ``__slots__`` class
with msgspec's ``__struct_fields__`` has the same constraint."""

import os
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class GenerateReqInput:
    """The HTTP body: every field here is client-controlled."""

    text: Optional[str] = None
    rid: Optional[str] = None
    custom: Dict = field(default_factory=dict)
    # Extra cache key for caller-defined request classification (SGLang namespaces prefixes by it).
    extra_key: Optional[str] = None


if os.environ.get("SGLANG_STUB_IO_STRUCT") != "msgspec":

    @dataclass
    class TokenizedGenerateReqInput:
        rid: str
        input_text: str
        input_ids: List[int]
        extra_key: Optional[str] = None

else:
    try:
        import msgspec

        class TokenizedGenerateReqInput(msgspec.Struct, kw_only=True):
            rid: Optional[str] = None
            input_text: Optional[str] = None
            input_ids: Optional[List[int]] = None
            extra_key: Optional[str] = None

    except ImportError:

        class TokenizedGenerateReqInput:
            __slots__ = __struct_fields__ = ("rid", "input_text", "input_ids", "extra_key")

            def __init__(self, *, rid=None, input_text=None, input_ids=None, extra_key=None):
                self.rid, self.input_text, self.input_ids, self.extra_key = rid, input_text, input_ids, extra_key
