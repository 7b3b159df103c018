// Host build of the kernels in src/main/cuda (tests only; built into target/, never shipped):
// the same source compiled by g++, each entry point running its kernel over a CPU grid loop of
// the given shape. Addresses in bases[] are host addresses.
#include <cstdint>

#include "../main/cuda/kvshield_kernels.cu"

extern "C" {

unsigned int kvs_host_max_keys() {
    return KVS_MAX_KEYS;
}

void kvs_host_scrub(unsigned int blocks, unsigned int threads, const unsigned long long* bases,
                    const unsigned int* pageBytes, unsigned int bufferCount, const unsigned int* pages,
                    unsigned int count, unsigned int unitsPerRegion) {
    kvs_host_launch(blocks, threads, kvs_scrub, bases, pageBytes, bufferCount, pages, count, unitsPerRegion);
}

void kvs_host_verify_zero(unsigned int blocks, unsigned int threads, const unsigned long long* bases,
                          const unsigned int* pageBytes, unsigned int bufferCount, const unsigned int* pages,
                          unsigned int count, unsigned int unitsPerRegion, unsigned int* dirty) {
    kvs_host_launch(blocks, threads, kvs_verify_zero, bases, pageBytes, bufferCount, pages, count, unitsPerRegion,
                    dirty);
}

void kvs_host_chacha20_xor(unsigned int blocks, unsigned int threads, const unsigned long long* bases,
                           const unsigned int* pageBytes, unsigned int bufferCount, const unsigned int* entries,
                           unsigned int count, unsigned int unitsPerRegion, const KvsKeys* keys) {
    kvs_host_launch(blocks, threads, kvs_chacha20_xor, bases, pageBytes, bufferCount, entries, count, unitsPerRegion,
                    *keys);
}
}

extern "C" void kvs_host_read_fold(unsigned int blocks, unsigned int threads, const uint4* src,
                                   unsigned long long units, unsigned int* out) {
    kvs_host_launch(blocks, threads, kvs_read_fold, src, units, out);
}
