"""Stand-in for SGLang's Req (``python/sglang/srt/managers/schedule_batch.py``)."""


class Req:
    def __init__(self, rid, origin_input_text, origin_input_ids, extra_key=None):
        self.rid = rid
        self.origin_input_text = origin_input_text
        self.origin_input_ids = origin_input_ids
        self.extra_key = extra_key
