"""Orders kvshield's GPU protection work after the engine's forward passes.

The ``cuda`` backend (cuda-scrub) makes its scrub/seal kernel wait on the engine stream it was given
at start (a fence it records there at each release) and on the events it was given then. Those
events are fixed handles; the engine's streams are not known at start (the overlap scheduler creates
its forward stream later) and SGLang's newer code hands its allocator a fresh event per forward
launch (``note_forward_launch(event)``). So the bridge gives the backend one event, ``done``, and
funnels every forward launch into it through a private ``fence`` stream:

- a launch on engine stream ``s``: record a marker event on ``s``, make ``fence`` wait on it,
  re-record ``done`` on ``fence``;
- SGLang's ``note_forward_launch(event)``: make ``fence`` wait on ``event``, re-record ``done``.

``done`` then completes only after every forward launched so far, on every stream, so a scrub of a
page released while the overlap scheduler's next batch may still write it waits for that batch. No
engine stream ever waits on kvshield, and nothing here waits on the host.
"""


def torch_cuda():
    """``torch.cuda``; tests swap this function for a fake CUDA surface."""
    import torch

    return torch.cuda


class LaunchFence:
    """One per allocator over CUDA memory; called from the scheduler thread only."""

    def __init__(self, device, cuda=None):
        self._cuda = cuda or torch_cuda()
        self.engine_stream = self._cuda.current_stream(device)
        self._fence = self._cuda.Stream(device=device)
        self._done = self._cuda.Event()
        # NOTE: torch creates a CUDA event at its first record; the backend needs a real handle now.
        self._done.record(self._fence)
        self._markers = {}
        self.launches = 0

    @property
    def stream_handle(self):
        """The engine's stream at start (``cuda_stream``; 0 is the legacy default stream)."""
        return int(self.engine_stream.cuda_stream)

    @property
    def event_handles(self):
        """The one event the backend waits on besides its fence on the engine stream."""
        return [int(self._done.cuda_event)]

    def note_stream_launch(self, stream=None):
        """A forward pass was just launched on ``stream`` (default: the current stream)."""
        s = stream if stream is not None else self._cuda.current_stream()
        marker = self._markers.get(s.cuda_stream)
        if marker is None:
            marker = self._markers[s.cuda_stream] = self._cuda.Event()
        marker.record(s)
        self._fence.wait_event(marker)
        self._done.record(self._fence)
        self.launches += 1

    def note_forward_launch(self, event):
        """SGLang's hook: ``event`` was recorded when a forward pass was launched."""
        self._fence.wait_event(event)
        self._done.record(self._fence)
        self.launches += 1
