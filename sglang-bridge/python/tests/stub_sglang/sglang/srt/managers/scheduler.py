"""Stand-in for SGLang's Scheduler: builds a Req from each tokenized request it receives."""

from sglang.srt.managers.schedule_batch import Req


class Scheduler:
    def __init__(self):
        self.waiting_queue = []

    def handle_generate_request(self, recv_req):
        self.waiting_queue.append(Req(recv_req.rid, recv_req.input_text, recv_req.input_ids))
