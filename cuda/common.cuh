// What the kernels share: integer types, and fp32 <-> storage-type conversions for float, __half,
// __nv_bfloat16 and the fp8 KV cache's __nv_fp8_e4m3 / __nv_fp8_e5m2 (to fp8: round to nearest even, saturating
// to the largest finite value, NaN kept: CUDA's __NV_SATFINITE). Compiled by nvcc (through PyCUDA) or, with
// MINIPAGED_EMULATION, by the host compiler against emulation/cuda_emu.h.
#pragma once

#ifndef MINIPAGED_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>
#endif

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e4m3 x) { return static_cast<float>(x); }
__device__ __forceinline__ float to_float(__nv_fp8_e5m2 x) { return static_cast<float>(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
template <>
__device__ __forceinline__ __nv_fp8_e4m3 from_float<__nv_fp8_e4m3>(float x) { return __nv_fp8_e4m3(x); }
template <>
__device__ __forceinline__ __nv_fp8_e5m2 from_float<__nv_fp8_e5m2>(float x) { return __nv_fp8_e5m2(x); }

// A cache of element type C holds the query's type T, or fp8 with per-kv-head scales (k_scale, v_scale
// [num_kv_heads]: stored = fp8(x / scale), read = fp8 * scale). The attention kernels fold the scales in where
// they cost nothing: k_scale into the query's scale, v_scale into the output.
template <typename T, typename C>
inline constexpr bool QUANTIZED = !std::is_same_v<T, C>;

// A kv head's scale; 1 for a cache that is not quantized (its kernels get null pointers).
template <typename T, typename C>
__device__ __forceinline__ float kv_scale(const float* scales, int kv_head) {
    if constexpr (QUANTIZED<T, C>) return scales[kv_head];
    return 1.0f;
}

// The end of a decode-attention thread block: combine its `parts` partial softmax states (each over its own tokens:
// running max m, in base 2 when BASE2, else base e; sum l; unnormalised accumulator acc) for every (query head,
// dim) of the GQA group, and write the output, or, with num_splits > 1, the split's unnormalised state (max in
// base e) for the merge kernel. The block's threads share the (head, dim) pairs.
template <typename T, int HEAD_DIM, bool BASE2>
__device__ void write_attention_output(
    T* __restrict__ out,                // [batch, num_q_heads, HEAD_DIM] (num_splits == 1)
    float* __restrict__ tmp_out,        // [batch, num_q_heads, num_splits, HEAD_DIM] (num_splits > 1)
    float* __restrict__ tmp_max,        // [batch, num_q_heads, num_splits]
    float* __restrict__ tmp_sum,        // [batch, num_q_heads, num_splits]
    const float* m,                     // [parts, stride]
    const float* l,                     // [parts, stride]
    const float* acc,                   // [parts, stride, HEAD_DIM]
    int parts, int stride, int group, int64_t seq, int kv_head, int num_q_heads, int split, int num_splits) {
    constexpr float LOG2E = 1.4426950408889634f;
    for (int o = threadIdx.x; o < group * HEAD_DIM; o += blockDim.x) {
        const int head = o / HEAD_DIM, d = o % HEAD_DIM;
        float global_max = -INFINITY;
        for (int i = 0; i < parts; ++i) global_max = fmaxf(global_max, m[i * stride + head]);
        float total = 0.0f, value = 0.0f;
        if (global_max != -INFINITY) {  // -inf: a sequence of length 0, which attends to nothing
            for (int i = 0; i < parts; ++i) {
                const float shift = m[i * stride + head] - global_max;  // -inf for a part that saw no token
                const float weight = BASE2 ? exp2f(shift) : expf(shift);
                total += weight * l[i * stride + head];
                value += weight * acc[(i * stride + head) * HEAD_DIM + d];
            }
        }
        const int64_t q_head = (int64_t)kv_head * group + head;
        if (num_splits == 1) {
            // total is 0 only for a sequence of length 0: its output is 0 (not 0/0)
            out[(seq * num_q_heads + q_head) * HEAD_DIM + d] = from_float<T>(total > 0.0f ? value / total : 0.0f);
        } else {
            const int64_t part = (seq * num_q_heads + q_head) * num_splits + split;
            tmp_out[part * HEAD_DIM + d] = value;
            if (d == 0) {
                tmp_max[part] = BASE2 ? global_max / LOG2E : global_max;
                tmp_sum[part] = total;
            }
        }
    }
}
