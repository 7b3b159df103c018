// kvshield fused page kernels: one launch covers every listed page across every layer buffer.
//
// Geometry (fixed contract with allocator-api's PoolGeometry): buffer b is one region at
// bases[b]; page p of buffer b is pageBytes[b] bytes at bases[b] + p * pageBytes[b]. A launch
// walks a flat index over (list entry, buffer, unit) with a grid-stride loop: consecutive threads
// take consecutive units of one page region, so stores coalesce. A unit is 16 bytes for scrub and
// verify-zero and one 64-byte ChaCha20 block for chacha20-xor; unitsPerRegion covers the largest
// buffer's page and threads past a smaller page's end do nothing. 16-byte accesses are used only
// where the address is 16-byte aligned and the unit is whole; otherwise bytes, so page sizes that
// are not multiples of 16 are exact.
//
// The same source compiles with g++ (kvs_grid.h maps the CUDA names onto a CPU grid loop) so the
// kernel logic is tested byte for byte on machines without a GPU.
#include "kvs_grid.h"

// Distinct keys one chacha20-xor launch can carry in its parameters (Java: KernelAbi.MAX_KEY_SLOTS).
#define KVS_MAX_KEYS 16

// The batch's distinct 256-bit keys as little-endian words, passed by value in the launch
// parameters: no key table lives in device memory.
struct KvsKeys {
    unsigned int words[KVS_MAX_KEYS * 8];
};

__device__ __forceinline__ unsigned long long kvs_first_index() {
    return (unsigned long long) blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ unsigned long long kvs_stride() {
    return (unsigned long long) gridDim.x * blockDim.x;
}

__device__ __forceinline__ bool kvs_aligned16(const unsigned char* p) {
    return (((unsigned long long) p) & 15ull) == 0;
}

// One unit of a launch: flat index i split into (list entry, buffer, unit), with the address of
// the unit's first byte and how many of its unitBytes bytes lie inside the page (0: past the end
// of a smaller buffer's page; nothing to do).
struct KvsUnit {
    unsigned char* p;
    unsigned int n;
    unsigned int entry;
    unsigned int buffer;
    unsigned int unit;
};

__device__ __forceinline__ KvsUnit kvs_unit(unsigned long long i, const unsigned long long* __restrict__ bases,
                                            const unsigned int* __restrict__ pageBytes, unsigned int bufferCount,
                                            const unsigned int* __restrict__ pages, unsigned int unitsPerRegion,
                                            unsigned int unitBytes) {
    KvsUnit u;
    const unsigned long long region = i / unitsPerRegion;
    u.unit = (unsigned int) (i - region * unitsPerRegion);
    u.entry = (unsigned int) (region / bufferCount);
    u.buffer = (unsigned int) (region - (unsigned long long) u.entry * bufferCount);
    const unsigned long long bytes = pageBytes[u.buffer];
    const unsigned long long start = (unsigned long long) u.unit * unitBytes;
    if (start >= bytes) {
        u.p = 0;
        u.n = 0;
        return u;
    }
    u.p = (unsigned char*) (bases[u.buffer] + (unsigned long long) pages[u.entry] * bytes + start);
    u.n = (unsigned int) (bytes - start < unitBytes ? bytes - start : unitBytes);
    return u;
}

// Zeroes every buffer of pages[0 .. count).
extern "C" __global__ void kvs_scrub(const unsigned long long* __restrict__ bases,
                                     const unsigned int* __restrict__ pageBytes, unsigned int bufferCount,
                                     const unsigned int* __restrict__ pages, unsigned int count,
                                     unsigned int unitsPerRegion) {
    const unsigned long long total = (unsigned long long) count * bufferCount * unitsPerRegion;
    for (unsigned long long i = kvs_first_index(); i < total; i += kvs_stride()) {
        const KvsUnit u = kvs_unit(i, bases, pageBytes, bufferCount, pages, unitsPerRegion, 16u);
        if (u.n == 16u && kvs_aligned16(u.p)) {
            *(uint4*) u.p = make_uint4(0u, 0u, 0u, 0u);
        } else {
            for (unsigned int k = 0; k < u.n; k++) {
                u.p[k] = 0;
            }
        }
    }
}

// Sets dirty[e] to 1 for every entry e of pages[0 .. count) holding a non-zero byte in any
// buffer; entries found clean are left as the caller set them (zero).
extern "C" __global__ void kvs_verify_zero(const unsigned long long* __restrict__ bases,
                                           const unsigned int* __restrict__ pageBytes, unsigned int bufferCount,
                                           const unsigned int* __restrict__ pages, unsigned int count,
                                           unsigned int unitsPerRegion, unsigned int* __restrict__ dirty) {
    const unsigned long long total = (unsigned long long) count * bufferCount * unitsPerRegion;
    for (unsigned long long i = kvs_first_index(); i < total; i += kvs_stride()) {
        const KvsUnit u = kvs_unit(i, bases, pageBytes, bufferCount, pages, unitsPerRegion, 16u);
        unsigned int acc = 0;
        if (u.n == 16u && kvs_aligned16(u.p)) {
            const uint4 v = *(const uint4*) u.p;
            acc = v.x | v.y | v.z | v.w;
        } else {
            for (unsigned int k = 0; k < u.n; k++) {
                acc |= u.p[k];
            }
        }
        if (acc != 0u) {
            KVS_ATOMIC_OR(&dirty[u.entry], 1u);
        }
    }
}

__device__ __forceinline__ unsigned int kvs_rotl(unsigned int v, int n) {
    return (v << n) | (v >> (32 - n));
}

#define KVS_QR(a, b, c, d)                                                                                 \
    a += b; d ^= a; d = kvs_rotl(d, 16);                                                                  \
    c += d; b ^= c; b = kvs_rotl(b, 12);                                                                  \
    a += b; d ^= a; d = kvs_rotl(d, 8);                                                                   \
    c += d; b ^= c; b = kvs_rotl(b, 7);

// One RFC 8439 ChaCha20 block (20 rounds): state words 0-3 constants, 4-11 key, 12 counter,
// 13-15 nonce; out receives the 16 keystream words (little-endian byte order when serialised).
__device__ __forceinline__ void kvs_chacha20_block(const unsigned int* key, unsigned int counter, unsigned int n0,
                                                   unsigned int n1, unsigned int n2, unsigned int out[16]) {
    const unsigned int in[16] = {0x61707865u, 0x3320646eu, 0x79622d32u, 0x6b206574u, key[0], key[1], key[2],
                                 key[3],      key[4],      key[5],      key[6],      key[7], counter, n0, n1, n2};
    unsigned int x0 = in[0], x1 = in[1], x2 = in[2], x3 = in[3], x4 = in[4], x5 = in[5], x6 = in[6], x7 = in[7];
    unsigned int x8 = in[8], x9 = in[9], x10 = in[10], x11 = in[11], x12 = in[12], x13 = in[13], x14 = in[14],
                 x15 = in[15];
    for (int round = 0; round < 10; round++) {
        KVS_QR(x0, x4, x8, x12)
        KVS_QR(x1, x5, x9, x13)
        KVS_QR(x2, x6, x10, x14)
        KVS_QR(x3, x7, x11, x15)
        KVS_QR(x0, x5, x10, x15)
        KVS_QR(x1, x6, x11, x12)
        KVS_QR(x2, x7, x8, x13)
        KVS_QR(x3, x4, x9, x14)
    }
    out[0] = x0 + in[0];
    out[1] = x1 + in[1];
    out[2] = x2 + in[2];
    out[3] = x3 + in[3];
    out[4] = x4 + in[4];
    out[5] = x5 + in[5];
    out[6] = x6 + in[6];
    out[7] = x7 + in[7];
    out[8] = x8 + in[8];
    out[9] = x9 + in[9];
    out[10] = x10 + in[10];
    out[11] = x11 + in[11];
    out[12] = x12 + in[12];
    out[13] = x13 + in[13];
    out[14] = x14 + in[14];
    out[15] = x15 + in[15];
}

// XORs every buffer of each listed page in place with its ChaCha20 keystream: entry e is page
// entries[e] at generation entries[count + e] under key slot entries[2 * count + e]; nonce =
// (page, generation, global buffer index), block counter = byte offset in the page region / 64.
// Sealing and unsealing are the same operation.
extern "C" __global__ void kvs_chacha20_xor(const unsigned long long* __restrict__ bases,
                                            const unsigned int* __restrict__ pageBytes, unsigned int bufferCount,
                                            const unsigned int* __restrict__ entries, unsigned int count,
                                            unsigned int unitsPerRegion, KvsKeys keys) {
    const unsigned long long total = (unsigned long long) count * bufferCount * unitsPerRegion;
    for (unsigned long long i = kvs_first_index(); i < total; i += kvs_stride()) {
        const KvsUnit u = kvs_unit(i, bases, pageBytes, bufferCount, entries, unitsPerRegion, 64u);
        if (u.n == 0u) {
            continue;
        }
        const unsigned int generation = entries[count + u.entry];
        const unsigned int slot = entries[2u * count + u.entry];
        unsigned int ks[16];
        kvs_chacha20_block(&keys.words[slot * 8u], u.unit, entries[u.entry], generation, u.buffer, ks);
        if (u.n == 64u && kvs_aligned16(u.p)) {
            uint4* q = (uint4*) u.p;
            for (int k = 0; k < 4; k++) {
                uint4 v = q[k];
                v.x ^= ks[4 * k];
                v.y ^= ks[4 * k + 1];
                v.z ^= ks[4 * k + 2];
                v.w ^= ks[4 * k + 3];
                q[k] = v;
            }
        } else {
            // Constant word indices keep ks in registers (a variable index would spill it to local memory).
            KVS_UNROLL
            for (unsigned int w = 0; w < 16u; w++) {
                for (unsigned int b = 0; b < 4u && 4u * w + b < u.n; b++) {
                    u.p[4u * w + b] ^= (unsigned char) (ks[w] >> (8u * b));
                }
            }
        }
    }
}

// Benchmark baseline (a plain read at full bandwidth): each thread XOR-folds its grid-stride
// share of units 16-byte words at src and writes the fold to out[its global thread index], so the
// loads cannot be optimised away. src must be 16-byte aligned.
extern "C" __global__ void kvs_read_fold(const uint4* __restrict__ src, unsigned long long units,
                                         unsigned int* __restrict__ out) {
    unsigned int acc = 0;
    for (unsigned long long i = kvs_first_index(); i < units; i += kvs_stride()) {
        const uint4 v = src[i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    out[kvs_first_index()] = acc;
}
