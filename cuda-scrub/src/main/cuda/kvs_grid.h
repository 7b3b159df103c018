// Maps the CUDA names the kernels use onto a sequential CPU grid loop when the source is compiled
// by a host compiler (g++) instead of nvcc. Under nvcc this header only defines nothing new.
//
// The kernels keep to what a sequential loop runs exactly: no shared memory, no __syncthreads, no
// warp intrinsics, every output byte written by one thread (verify-zero's dirty flags take only
// the constant 1 through atomicOr, which is order-independent), so running the threads one after
// another gives the same bytes as the GPU.
#ifndef KVS_GRID_H
#define KVS_GRID_H

#ifdef __CUDACC__
#define KVS_ATOMIC_OR(ptr, value) atomicOr((ptr), (value))
#define KVS_UNROLL _Pragma("unroll")
#else
#include <cstdint>

#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__ __restrict

struct kvs_dim3 {
    unsigned int x, y, z;
};
struct alignas(16) uint4 {
    unsigned int x, y, z, w;
};
static inline uint4 make_uint4(unsigned int x, unsigned int y, unsigned int z, unsigned int w) {
    return uint4{x, y, z, w};
}

// The current "thread" of the host grid loop; one grid runs at a time per host thread.
static thread_local kvs_dim3 blockIdx, threadIdx, blockDim, gridDim;

#define KVS_ATOMIC_OR(ptr, value) (*(ptr) |= (value))
#define KVS_UNROLL _Pragma("GCC unroll 16")

// Runs kernel(args...) for every thread of a 1-D grid, in order.
template <typename Kernel, typename... Args>
static void kvs_host_launch(unsigned int blocks, unsigned int threads, Kernel kernel, Args... args) {
    gridDim = kvs_dim3{blocks, 1, 1};
    blockDim = kvs_dim3{threads, 1, 1};
    for (unsigned int b = 0; b < blocks; b++) {
        for (unsigned int t = 0; t < threads; t++) {
            blockIdx = kvs_dim3{b, 0, 0};
            threadIdx = kvs_dim3{t, 0, 0};
            kernel(args...);
        }
    }
}
#endif

#endif
