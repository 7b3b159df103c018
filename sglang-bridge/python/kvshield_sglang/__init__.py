"""kvshield inside SGLang: a leak-proof KV-cache page allocator, in-process through JPype.

Importing this package starts nothing: the JVM starts lazily, once per process, when the first
allocator is built. See README.md for the two ways to activate it in SGLang.
"""

__version__ = "0.1.0"
