// Paged cache write: the K/V of each new token into its slot of one layer's caches.
//
// One thread block per token; its threads copy the token's num_kv_heads x head_dim elements, 16 bytes at a time
// when every row is 16-byte aligned (`vectorized`, decided by the launcher), else one element at a time.
// slot = block * block_size + offset; slot < 0 marks a padding token and is skipped. Address math in int64.
// Into an fp8 cache (C an fp8 type) each element is quantized, fp8(x / scale of its kv head), one at a time.
#include "common.cuh"

template <typename T, typename C>
__device__ void cache_write(
    const T* __restrict__ key,            // [num_tokens, num_kv_heads, head_dim], token stride key_stride
    const T* __restrict__ value,          // [num_tokens, num_kv_heads, head_dim], token stride value_stride
    C* __restrict__ key_cache,            // [num_blocks, num_kv_heads, block_size, head_dim]
    C* __restrict__ value_cache,          // [num_blocks, num_kv_heads, block_size, head_dim]
    const int64_t* __restrict__ slot_mapping,  // [num_tokens]
    const float* __restrict__ k_scale,    // [num_kv_heads] (fp8 caches; null otherwise)
    const float* __restrict__ v_scale,    // [num_kv_heads] (fp8 caches; null otherwise)
    int64_t key_stride, int64_t value_stride, int num_kv_heads, int head_dim, int block_size, int vectorized) {
    const int64_t token = blockIdx.x;
    const int64_t slot = slot_mapping[token];
    if (slot < 0) return;
    const int64_t block = slot / block_size;
    const int64_t offset = slot % block_size;
    const T* key_row = key + token * key_stride;
    const T* value_row = value + token * value_stride;
    if constexpr (QUANTIZED<T, C>) {
        for (int i = threadIdx.x; i < num_kv_heads * head_dim; i += blockDim.x) {
            const int head = i / head_dim;
            const int64_t target = ((block * num_kv_heads + head) * block_size + offset) * head_dim + i % head_dim;
            // A true division, as vLLM's scaled_convert: x * (1 / scale) would round twice.
            key_cache[target] = from_float<C>(to_float(key_row[i]) / k_scale[head]);
            value_cache[target] = from_float<C>(to_float(value_row[i]) / v_scale[head]);
        }
    } else if (vectorized) {
        const int per_vector = 16 / sizeof(T);
        const int vectors_per_head = head_dim / per_vector;
        for (int i = threadIdx.x; i < num_kv_heads * vectors_per_head; i += blockDim.x) {
            const int head = i / vectors_per_head;
            const int64_t source = (int64_t)head * head_dim + (int64_t)(i % vectors_per_head) * per_vector;
            const int64_t target = ((block * num_kv_heads + head) * block_size + offset) * head_dim +
                                   (int64_t)(i % vectors_per_head) * per_vector;
            *reinterpret_cast<uint4*>(key_cache + target) = *reinterpret_cast<const uint4*>(key_row + source);
            *reinterpret_cast<uint4*>(value_cache + target) = *reinterpret_cast<const uint4*>(value_row + source);
        }
    } else {
        for (int i = threadIdx.x; i < num_kv_heads * head_dim; i += blockDim.x) {
            const int head = i / head_dim;
            const int64_t target = ((block * num_kv_heads + head) * block_size + offset) * head_dim + i % head_dim;
            key_cache[target] = key_row[i];
            value_cache[target] = value_row[i];
        }
    }
}

#define MINIPAGED_CACHE_WRITE(SUFFIX, T, C)                                                                     \
    extern "C" __global__ void cache_write_##SUFFIX(const T* key, const T* value, C* key_cache, C* value_cache, \
                                                    const int64_t* slot_mapping, const float* k_scale,          \
                                                    const float* v_scale, int64_t key_stride,                   \
                                                    int64_t value_stride, int num_kv_heads, int head_dim,       \
                                                    int block_size, int vectorized) {                           \
        cache_write<T, C>(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, key_stride,       \
                          value_stride, num_kv_heads, head_dim, block_size, vectorized);                        \
    }

MINIPAGED_CACHE_WRITE(f32, float, float)
MINIPAGED_CACHE_WRITE(f16, __half, __half)
MINIPAGED_CACHE_WRITE(bf16, __nv_bfloat16, __nv_bfloat16)
MINIPAGED_CACHE_WRITE(f32_e4m3, float, __nv_fp8_e4m3)
MINIPAGED_CACHE_WRITE(f16_e4m3, __half, __nv_fp8_e4m3)
MINIPAGED_CACHE_WRITE(bf16_e4m3, __nv_bfloat16, __nv_fp8_e4m3)
MINIPAGED_CACHE_WRITE(f32_e5m2, float, __nv_fp8_e5m2)
MINIPAGED_CACHE_WRITE(f16_e5m2, __half, __nv_fp8_e5m2)
MINIPAGED_CACHE_WRITE(bf16_e5m2, __nv_bfloat16, __nv_fp8_e5m2)
