_RADIX_CACHE_REGISTRY = {}


def register_radix_cache_backend(name, factory):
    if not name.strip():
        raise ValueError(f"register_radix_cache_backend: name must be non-empty, got {name!r}")
    if name in _RADIX_CACHE_REGISTRY:
        raise ValueError(f"register_radix_cache_backend: {name!r} is already registered")
    _RADIX_CACHE_REGISTRY[name] = factory


def get_radix_cache_factory(name):
    return _RADIX_CACHE_REGISTRY.get(name)


def registered_radix_cache_backends():
    return list(_RADIX_CACHE_REGISTRY)
