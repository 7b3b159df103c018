"""CUDA KV buffers reach the ``cuda`` backend with device pointers, the engine's stream and the
launch fence's event, and every forward launch funnels into that event. No GPU here: a fake
``torch.cuda`` surface (tests/fakes.py) stands in; the Java side runs for real and stops at its
GPU probe."""

import pytest

from conftest import require_module
from fakes import FakeCuda

torch = require_module("torch")


class FakeCudaBuffer:
    """A contiguous CUDA tensor's metadata: what buffers.describe reads."""

    def __init__(self, rows, address):
        self.shape = (rows, 1, 4)
        self.device = torch.device("cuda", 0)
        self._address = address

    def is_contiguous(self):
        return True

    def element_size(self):
        return 4

    def numel(self):
        return self.shape[0] * 4

    def data_ptr(self):
        return self._address


class FakeCudaPool:
    def __init__(self, size, page_size, layers=2):
        base = 0x7F00_0000_0000
        self.k_buffer = [FakeCudaBuffer(size + page_size, base + 0x10000 * (2 * i)) for i in range(layers)]
        self.v_buffer = [FakeCudaBuffer(size + page_size, base + 0x10000 * (2 * i + 1)) for i in range(layers)]


def test_forward_launches_on_every_stream_funnel_into_the_one_backend_event():
    from kvshield_sglang.launch_fence import LaunchFence

    cuda = FakeCuda()
    fence = LaunchFence(0, cuda=cuda)
    done = fence.event_handles[0]
    assert fence.stream_handle == 0 and done != 0  # legacy default stream; the event exists before Java sees it
    fence_stream = cuda.log[0][2]
    forward = cuda.Stream()
    copy = cuda.Stream()
    cuda.log.clear()
    cuda.set_current(forward)
    fence.note_stream_launch()
    fence.note_stream_launch(copy)
    sglang_event = cuda.Event()
    sglang_event.record(forward)
    fence.note_forward_launch(sglang_event)
    ops = [(op, a, b) for op, a, b in cuda.log]
    marker_f, marker_c = ops[0][1], ops[3][1]
    assert ops == [
        ("record", marker_f, forward.cuda_stream), ("wait", fence_stream, marker_f), ("record", done, fence_stream),
        ("record", marker_c, copy.cuda_stream), ("wait", fence_stream, marker_c), ("record", done, fence_stream),
        ("record", sglang_event.cuda_event, forward.cuda_stream), ("wait", fence_stream, sglang_event.cuda_event),
        ("record", done, fence_stream),
    ]
    assert fence.launches == 3


def test_cuda_buffers_reach_the_cuda_backend_with_pointers_stream_and_event(jvm, monkeypatch):
    from kvshield_sglang import allocator, launch_fence
    from kvshield_sglang.errors import KvShieldError

    cuda = FakeCuda()
    monkeypatch.setattr(launch_fence, "torch_cuda", lambda: cuda)
    with pytest.raises(KvShieldError) as e:
        allocator.PagedTokenToKVPoolAllocator(32, 4, torch.float32, "cuda:0", FakeCudaPool(32, 4), False,
                                              kvshield_settings={"advertisedContextTokens": 32})
    # The Java cuda provider took the hand-over (its argument checks passed) and stopped at the GPU.
    msg = str(e.value)
    assert "no usable GPU" in msg or "not device memory" in msg, msg
    assert e.value.java_class == "java.lang.IllegalArgumentException" or "Geometry" in e.value.java_class
    assert cuda.log and cuda.log[0][0] == "record"  # the backend's event was materialised first


def test_forward_hook_notes_launches_on_kvshield_allocators_only(monkeypatch):
    from sglang.srt.model_executor.model_runner import ModelRunner

    from kvshield_sglang import engine_hooks

    calls = []

    class Ours:
        _launch_fence = object()

        def note_forward_launch(self, event=None):
            calls.append(("ours", event))

    class Stock:
        def note_forward_launch(self, event):  # SGLang's own: an event is required
            calls.append(("stock", event))

    def forward(self, forward_batch, skip_attn_backend_init=None, pp_proxy_tensors=None):  # the model's forward
        calls.append(("forward", forward_batch))
        return forward_batch

    monkeypatch.setattr(ModelRunner, "forward", forward)  # SGLang's ModelRunner, its forward without a model
    engine_hooks.install_forward_hook(None)
    engine_hooks.install_forward_hook(None)  # idempotent

    def runner(alloc):
        r = ModelRunner.__new__(ModelRunner)
        r.token_to_kv_pool_allocator = alloc
        return r

    assert runner(Ours()).forward(1) == 1
    runner(Stock()).forward(2)
    assert calls == [("forward", 1), ("ours", None), ("forward", 2)]
