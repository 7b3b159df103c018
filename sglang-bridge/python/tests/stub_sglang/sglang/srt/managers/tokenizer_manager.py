"""Stand-in for SGLang's TokenizerManager (``python/sglang/srt/managers/tokenizer_manager.py``):
tokenizes, builds the tokenized request in ``_create_tokenized_object`` (the client's ``extra_key``
copied over), then sends it pickled to the scheduler."""

import pickle

from sglang.srt.managers.io_struct import TokenizedGenerateReqInput


class TokenizerManager:
    def __init__(self):
        self.sent = []  # what crossed to the scheduler process, pickled

    async def _tokenize_one_request(self, obj):
        return self._create_tokenized_object(obj, obj.text, [ord(c) for c in obj.text])

    def _create_tokenized_object(self, obj, input_text, input_ids):
        return TokenizedGenerateReqInput(rid=obj.rid, input_text=input_text, input_ids=input_ids,
                                         extra_key=obj.extra_key)

    async def generate_request(self, obj, request=None):
        tokenized = await self._tokenize_one_request(obj)
        self.sent.append(pickle.dumps(tokenized))
        yield {"rid": obj.rid}
