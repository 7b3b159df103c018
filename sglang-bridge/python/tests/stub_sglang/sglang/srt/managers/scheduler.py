"""Stand-in for SGLang's Scheduler (``python/sglang/srt/managers/scheduler.py``): builds a Req from
each tokenized request it receives; a batch is handled request by request."""

from sglang.srt.managers.schedule_batch import Req


class Scheduler:
    def __init__(self):
        self.waiting_queue = []

    def handle_generate_request(self, recv_req):
        self.waiting_queue.append(Req(recv_req.rid, recv_req.input_text, recv_req.input_ids,
                                      extra_key=recv_req.extra_key))

    def handle_batch_generate_request(self, recv_req):
        for tokenized_req in recv_req:
            self.handle_generate_request(tokenized_req)
