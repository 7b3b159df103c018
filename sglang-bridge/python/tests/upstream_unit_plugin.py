"""A pytest plug-in (``-p upstream_unit_plugin``) that runs SGLang's own unit tests on the real SGLang
(:mod:`sglang_source`), with kvshield's plug-in loaded first when ``KVSHIELD_SWAP=1``: SGLang's allocator
classes are then kvshield's, in every module, exactly as in a server."""

import os

import sglang_source


def pytest_configure(config):
    sglang_source.setup()
    if os.environ.get("KVSHIELD_SWAP") == "1":
        import sglang.srt.mem_cache.allocator as allocators

        from kvshield_sglang import plugin

        plugin.load()
        swapped = [c.__module__ for c in (allocators.TokenToKVPoolAllocator, allocators.PagedTokenToKVPoolAllocator)]
        print(f"kvshield allocators swapped in: {swapped}")
