class PrefillBootstrapQueue:
    """Stock behaviour before the upstream handoff-isolation fix: every request is bootstrapped."""

    def __init__(self, scheduler):
        self.scheduler = scheduler
        self.queue = []

    def add(self, req, num_kv_heads):
        self.queue.append(req)
