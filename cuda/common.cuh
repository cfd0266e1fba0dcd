// What the kernels share: integer types, and fp32 <-> storage-type conversions for float, __half and
// __nv_bfloat16. Compiled by nvcc (through PyCUDA) or, with MINIPAGED_EMULATION, by the host compiler against
// emulation/cuda_emu.h.
#pragma once

#ifndef MINIPAGED_EMULATION
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#endif

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
__device__ __forceinline__ T from_float(float x);
template <>
__device__ __forceinline__ float from_float<float>(float x) { return x; }
template <>
__device__ __forceinline__ __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }
