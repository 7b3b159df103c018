class FINISH_ABORT:
    def __init__(self, message=None, status_code=None):
        self.message, self.status_code = message, status_code

    def to_json(self):
        return {"type": "abort", "message": self.message, "status_code": self.status_code}


def prepare_abort(req, error_message, status_code=None):
    req.finished_reason = FINISH_ABORT(error_message, status_code)
