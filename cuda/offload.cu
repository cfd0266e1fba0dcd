// KV offloading's device side: whole blocks of every layer's K and V gathered into one contiguous staging buffer
// (before it is copied down to the host pool: one large copy per block instead of 2 x num_layers small ones) and
// scattered back from it (after a load from the host pool). minipaged_cli/dataplane/offload.py launches them.
//
// Grid (num_pairs, num_layers, 2): one thread block per (block, layer, K or V), copying block_bytes contiguous
// bytes 16 at a time when `vectorized` (the launcher found every cache's base pointer and the staging buffer
// 16-byte aligned and block_bytes a multiple of 16), else one byte at a time. Dtype-agnostic. The caches are
// addressed through a table of base pointers (each layer's K and V are separate allocations, as PagedKVCache
// holds them). The launcher checks that no block id repeats in a scatter: thread blocks run concurrently.
#include "common.cuh"

__device__ __forceinline__ void copy_bytes(char* __restrict__ dst, const char* __restrict__ src, int64_t bytes,
                                           int vectorized) {
    if (vectorized) {
        uint4* dst16 = reinterpret_cast<uint4*>(dst);
        const uint4* src16 = reinterpret_cast<const uint4*>(src);
        for (int64_t i = threadIdx.x; i < bytes / 16; i += blockDim.x) dst16[i] = src16[i];
    } else {
        for (int64_t i = threadIdx.x; i < bytes; i += blockDim.x) dst[i] = src[i];
    }
}

// The cache block and the staging slot of thread block (pair, layer, K or V).
__device__ __forceinline__ void locate(char** cache_block, char** staged, char* staging, const int64_t* cache_ptrs,
                                       const int64_t* block_ids, int num_layers, int64_t block_bytes) {
    const int64_t pair = blockIdx.x, layer = blockIdx.y, kv = blockIdx.z;
    char* cache = reinterpret_cast<char*>(cache_ptrs[kv * num_layers + layer]);
    *cache_block = cache + block_ids[pair] * block_bytes;
    *staged = staging + ((pair * num_layers + layer) * 2 + kv) * block_bytes;
}

extern "C" __global__ void gather_blocks(
    char* __restrict__ staging,             // [num_pairs, num_layers, 2, block_bytes]
    const int64_t* __restrict__ cache_ptrs,  // [2, num_layers]: each layer's K cache, then each layer's V cache,
                                             // each [num_blocks, block_bytes]
    const int64_t* __restrict__ block_ids,   // [num_pairs]
    int num_layers, int64_t block_bytes, int vectorized) {
    char *cache_block, *staged;
    locate(&cache_block, &staged, staging, cache_ptrs, block_ids, num_layers, block_bytes);
    copy_bytes(staged, cache_block, block_bytes, vectorized);
}

extern "C" __global__ void scatter_blocks(
    const char* __restrict__ staging,        // [num_pairs, num_layers, 2, block_bytes]
    const int64_t* __restrict__ cache_ptrs,  // [2, num_layers], as gather_blocks
    const int64_t* __restrict__ block_ids,   // [num_pairs], distinct
    int num_layers, int64_t block_bytes, int vectorized) {
    char *cache_block, *staged;
    locate(&cache_block, &staged, const_cast<char*>(staging), cache_ptrs, block_ids, num_layers, block_bytes);
    copy_bytes(cache_block, staged, block_bytes, vectorized);
}
