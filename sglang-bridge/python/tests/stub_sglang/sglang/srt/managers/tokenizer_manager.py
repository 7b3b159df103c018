"""Stand-in for SGLang's TokenizerManager: tokenizes, then sends the pickled request to the scheduler."""

import pickle

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput


class TokenizerManager:
    def __init__(self):
        self.sent = []  # what crossed to the scheduler process, pickled

    async def _tokenize_one_request(self, obj):
        return TokenizedGenerateReqInput(obj.rid, obj.text, [ord(c) for c in obj.text])

    async def generate_request(self, obj, request=None):
        tokenized = await self._tokenize_one_request(obj)
        self.sent.append(pickle.dumps(tokenized))
        yield {"rid": obj.rid}
