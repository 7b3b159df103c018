"""Stand-in for the part of SGLang's ``python/sglang/srt/mem_cache/radix_cache.py`` other caches
reuse: ``RadixKey`` (token ids plus an ``extra_key`` namespace tag) and ``TreeNode``."""

import time
from collections import defaultdict


class RadixKey:
    def __init__(self, token_ids, extra_key=None, is_bigram=False):
        self.token_ids = token_ids
        self.extra_key = extra_key
        self.is_bigram = is_bigram

    def __len__(self):
        return len(self.token_ids)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return RadixKey(self.token_ids[idx], self.extra_key)
        return RadixKey([self.token_ids[idx]], self.extra_key)


class TreeNode:
    counter = 0

    def __init__(self, id=None, priority=0):  # noqa: A002 (SGLang's name)
        self.children = defaultdict(TreeNode)
        self.parent = None
        self.key = None
        self.value = None
        self.lock_ref = 0
        self.last_access_time = time.monotonic()
        self.creation_time = time.monotonic()
        self.hit_count = 0
        self.host_ref_counter = 0
        self.host_value = None
        self.hash_value = None
        self.priority = priority
        self.id = TreeNode.counter if id is None else id
        TreeNode.counter += 1

    @property
    def evicted(self):
        return self.value is None

    @property
    def backuped(self):
        return self.host_value is not None

    def __lt__(self, other):
        return self.last_access_time < other.last_access_time
