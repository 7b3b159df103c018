"""SGLang's real KV pools on the CPU with two read helpers, batch and reference helpers, and stand-ins for
CUDA only (a device-only index tensor, ``torch.cuda``'s streams and events): this machine has no GPU."""

import torch
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool


class MHAPool(MHATokenToKVPool):
    """SGLang's ``MHATokenToKVPool`` on the CPU (one K and one V tensor per layer, ``(size + page_size, heads,
    head_dim)``), plus :meth:`buffers` and :meth:`read` for the tests' oracles."""

    def __init__(self, size, page_size, layers=2, heads=1, head_dim=4, dtype=torch.float32):
        super().__init__(size=size, page_size=page_size, dtype=dtype, head_num=heads, head_dim=head_dim,
                         layer_num=layers, device="cpu", enable_memory_saver=False)

    def buffers(self):
        """Every buffer that holds KV: K then V, layer by layer."""
        return list(self.k_buffer) + list(self.v_buffer)

    def read(self, slots):
        """The raw bytes at ``slots`` of every buffer (what a kernel reading the pool would see)."""
        return torch.stack([b[slots] for b in self.buffers()])


class MLAPool(MLATokenToKVPool):
    """SGLang's ``MLATokenToKVPool`` on the CPU (one latent tensor per layer)."""

    def __init__(self, size, page_size, layers=2, kv_lora_rank=6, qk_rope_head_dim=2):
        super().__init__(size=size, page_size=page_size, dtype=torch.float32, kv_lora_rank=kv_lora_rank,
                         qk_rope_head_dim=qk_rope_head_dim, layer_num=layers, device="cpu", enable_memory_saver=False)


def _enumerate_fakes():
    """The test subclasses add read helpers only, no tensors (kvshield refuses pool classes it has not enumerated)."""
    from kvshield_sglang import buffers

    buffers.enumerate_like(MHAPool, "MHATokenToKVPool")
    buffers.enumerate_like(MLAPool, "MLATokenToKVPool")


_enumerate_fakes()


def extend_batch(allocator, reqs, seq_lens):
    """A ScheduleBatch stand-in for SGLang's ``alloc_for_extend``: ``reqs`` from empty prefixes to ``seq_lens``."""
    b = type("Batch", (), {})()
    b.reqs = reqs
    b.tree_cache = type("TreeCache", (), {"token_to_kv_pool_allocator": allocator})()
    b.prefix_lens = [0] * len(reqs)
    b.seq_lens_cpu = torch.tensor(seq_lens)
    b.seq_lens = b.seq_lens_cpu
    b.extend_num_tokens = sum(seq_lens)
    return b


def ref_alloc_extend(prefix_lens, seq_lens, last_loc, free_pages, page_size):
    """SGLang's extend semantics: per request, fill the prefix's last partial page, then whole new
    pages, then a new partial page, taking new pages from ``free_pages`` in order."""
    out, next_page = [], 0
    for prefix, seq, last in zip(prefix_lens, seq_lens, last_loc):
        pos = prefix
        while pos < seq and pos % page_size:
            last += 1
            out.append(last)
            pos += 1
        while pos < seq:
            page = free_pages[next_page]
            next_page += 1
            n = min(page_size, seq - pos)
            out.extend(page * page_size + k for k in range(n))
            pos += n
    return out, next_page


def bridged_pool(page_size=4, size=32, **settings):
    """kvshield's allocator over an ``MHAPool`` of ``size`` tokens (the token allocator when ``page_size`` is 1) at
    ZERO with a 32-token advertised context; ``settings`` adds or overrides bridge settings (``strict=True``)."""
    from kvshield_sglang.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator

    s = dict({"level": "ZERO", "advertisedContextTokens": 32}, **settings)
    if page_size == 1:
        return TokenToKVPoolAllocator(size, torch.float32, "cpu", MHAPool(size, 1), False, kvshield_settings=s)
    return PagedTokenToKVPoolAllocator(size, page_size, torch.float32, "cpu", MHAPool(size, page_size), False,
                                       kvshield_settings=s)


def widened_index(index):
    """An index (or tuple of them) with int32 tensors widened to int64, values unchanged: SGLang's
    ``req_to_token`` rows are int32 and index KV buffers directly, which torch 2 accepts and this
    machine's torch 1.13 does not."""
    if isinstance(index, tuple):
        return tuple(widened_index(i) for i in index)
    if isinstance(index, torch.Tensor) and index.dtype == torch.int32:
        return index.as_subclass(torch.Tensor).to(torch.int64)
    return index


class DeviceToHostCopy(AssertionError):
    """A device tensor's values were read on the host (a GPU->host synchronisation)."""


class DeviceOnlyTensor:
    """A CUDA tensor stand-in: shape, dtype and device are host metadata; any read of its values on
    the host (``.cpu()``, ``.to("cpu")``, ``.tolist()``, ``.item()``, iteration, NumPy, a blocking
    ``copy_``) raises. Device-side work stays possible: ``clone``, ``reshape``, ``torch.cat``, and a
    non-blocking ``host.copy_(t, non_blocking=True)``, which leaves garbage in ``host`` until an
    event recorded after it is synchronized (:class:`FakeCuda`)."""

    GARBAGE = -7

    def __init__(self, values, dtype=torch.int64):
        self._t = torch.as_tensor(values, dtype=dtype)
        self.dtype = self._t.dtype
        self.device = torch.device("cuda", 0)
        self.is_cpu = False
        self.shape = self._t.shape

    def numel(self):
        return self._t.numel()

    def __len__(self):
        return len(self._t)

    def reshape(self, *shape):
        return DeviceOnlyTensor(self._t.reshape(*shape), self.dtype)

    def clone(self):
        return DeviceOnlyTensor(self._t.clone(), self.dtype)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.cat:
            return DeviceOnlyTensor(torch.cat([t._t for t in args[0]]), args[0][0].dtype)
        if func is torch.Tensor.copy_ and isinstance(args[0], torch.Tensor):
            if not kwargs.get("non_blocking"):
                raise DeviceToHostCopy("blocking device->host copy of a CUDA index tensor")
            host, values = args[0], args[1]._t
            host.fill_(cls.GARBAGE)  # NOTE: the bytes land only when the copy's stream gets there
            IN_FLIGHT.append((host, values))
            return host
        raise DeviceToHostCopy(f"{func.__name__} on a CUDA index tensor")

    def _copy(self, *a, **k):
        raise DeviceToHostCopy("device->host copy of a CUDA index tensor")

    cpu = to = tolist = item = numpy = __iter__ = __int__ = __index__ = __array__ = _copy


# Non-blocking copies enqueued and not yet reached by a synchronized event: (host tensor, values).
IN_FLIGHT = []


class FakeCuda:
    """The part of ``torch.cuda`` the launch fence uses; every call is logged in order as
    (op, what, on) with streams and events named by their handles."""

    def __init__(self):
        self.log = []
        self._next = 0x1000
        self._current = FakeCuda._Stream(self, handle=0)

    def _handle(self):
        self._next += 0x10
        return self._next

    class _Stream:
        def __init__(self, cuda, device=None, handle=None):
            self._cuda = cuda
            self.cuda_stream = cuda._handle() if handle is None else handle

        def wait_event(self, event):
            self._cuda.log.append(("wait", self.cuda_stream, event.cuda_event))

    class _Event:
        def __init__(self, cuda):
            self._cuda = cuda
            self.cuda_event = 0  # NOTE: like torch, the CUDA event exists only after its first record
            self._copies = []

        def record(self, stream):
            if self.cuda_event == 0:
                self.cuda_event = self._cuda._handle()
            self._cuda.log.append(("record", self.cuda_event, stream.cuda_stream))
            self._copies = list(IN_FLIGHT)  # the copies enqueued before the record complete with it

        def synchronize(self):
            self._cuda.log.append(("synchronize", self.cuda_event, None))
            for host, values in self._copies:
                host.copy_(values)
            done = {id(c) for c in self._copies}
            IN_FLIGHT[:] = [c for c in IN_FLIGHT if id(c) not in done]
            self._copies = []

        def query(self):
            raise AssertionError("an event was polled: availability would depend on timing")

    def current_stream(self, device=None):
        return self._current

    def set_current(self, stream):
        self._current = stream

    def Stream(self, device=None):  # noqa: N802 (torch's name)
        return FakeCuda._Stream(self, device)

    def Event(self):  # noqa: N802 (torch's name)
        return FakeCuda._Event(self)


def install_fake_cuda(monkeypatch):
    """Swaps the bridge's ``torch.cuda`` for a :class:`FakeCuda` (no copy left in flight from before)."""
    from kvshield_sglang import launch_fence

    cuda = FakeCuda()
    IN_FLIGHT.clear()
    monkeypatch.setattr(launch_fence, "torch_cuda", lambda: cuda)
    return cuda
