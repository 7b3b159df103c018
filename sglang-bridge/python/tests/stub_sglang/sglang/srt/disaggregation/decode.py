from sglang.srt.disaggregation.base import KVPoll
from sglang.srt.disaggregation.utils import prepare_abort


class DecodeTransferQueue:
    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue = []

    def pop_transferred(self):
        done, failed, keep = [], [], []
        for decode_req in self.queue:
            poll = decode_req.kv_receiver.poll()
            if poll == KVPoll.Success:
                done.append(decode_req.req)
            elif poll == KVPoll.Failed:
                prepare_abort(decode_req.req, "transfer failed", status_code=500)
                failed.append(decode_req.req)
            else:
                keep.append(decode_req)
        self.queue = keep
        if failed:
            self.scheduler.stream_output(failed, False)
        return done
