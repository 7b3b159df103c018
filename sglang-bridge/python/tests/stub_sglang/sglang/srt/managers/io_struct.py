"""Stand-in for SGLang's request structs (dataclasses, pickled between processes)."""

from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class GenerateReqInput:
    """The HTTP body: every field here is client-controlled."""

    text: Optional[str] = None
    rid: Optional[str] = None
    custom: Dict = field(default_factory=dict)


@dataclass
class TokenizedGenerateReqInput:
    rid: str
    input_text: str
    input_ids: List[int]
