"""Stand-in for SGLang's ``mem_cache/kv_cache_builder.py``: the retraction-backend resolver's signature."""


def resolve_decode_retraction_backup(*, tp_worker):
    return "cpu_tensor"
