// Block copies for copy-on-write: pair i of block_mapping copies block src to block dst in one layer's K and V
// caches (a forked sequence's shared, partly filled last block, before its next token is written there).
//
// One thread block per pair. Dtype-agnostic: a block is block_bytes contiguous bytes, copied 16 bytes at a time
// when `vectorized` (the launcher found both caches' base pointers 16-byte aligned and block_bytes a multiple of
// 16, so every block starts aligned), else one byte at a time. The launcher checks that no dst is also a src or
// another pair's dst: pairs run concurrently.
#include "common.cuh"

extern "C" __global__ void copy_blocks(
    char* __restrict__ key_cache,              // [num_blocks, block_bytes]
    char* __restrict__ value_cache,            // [num_blocks, block_bytes]
    const int64_t* __restrict__ block_mapping,  // [num_pairs, 2]: (src, dst)
    int64_t block_bytes, int vectorized) {
    const int64_t src = block_mapping[2 * (int64_t)blockIdx.x] * block_bytes;
    const int64_t dst = block_mapping[2 * (int64_t)blockIdx.x + 1] * block_bytes;
    if (vectorized) {
        const uint4* key_src = reinterpret_cast<const uint4*>(key_cache + src);
        const uint4* value_src = reinterpret_cast<const uint4*>(value_cache + src);
        uint4* key_dst = reinterpret_cast<uint4*>(key_cache + dst);
        uint4* value_dst = reinterpret_cast<uint4*>(value_cache + dst);
        for (int64_t i = threadIdx.x; i < block_bytes / 16; i += blockDim.x) {
            key_dst[i] = key_src[i];
            value_dst[i] = value_src[i];
        }
    } else {
        for (int64_t i = threadIdx.x; i < block_bytes; i += blockDim.x) {
            key_cache[dst + i] = key_cache[src + i];
            value_cache[dst + i] = value_cache[src + i];
        }
    }
}
