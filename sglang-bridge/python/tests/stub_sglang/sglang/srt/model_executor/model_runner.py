# Imports the allocator classes by name at import time, as SGLang's model runner does.
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator  # noqa: F401
from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator  # noqa: F401
