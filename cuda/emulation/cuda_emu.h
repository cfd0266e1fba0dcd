// A CPU emulation of the parts of CUDA that minipaged's kernels use, so that the same .cu source runs on the
// CPU in CI: grid and block indices, __shared__ memory per block, __syncthreads as a barrier across the block's
// threads, warp shuffles and __syncwarp across 32 lanes, the fp16 / bf16 types with their conversions, and the
// warp-level instructions of paged_attention_tc.cu: mma.sync m16n8k16 (fp32 accumulation), ldmatrix .x4 .trans
// and cp.async (a synchronous copy, so its waits have nothing to wait for). The collective ones gather every
// lane's operands and give each lane its part by the PTX ISA's fragment layouts.
//
// Every CUDA thread of a block is an OS thread; the block's threads run the grid's blocks one after another, in
// the same order, with a barrier between blocks, so a function-static variable (what __shared__ becomes here)
// is exactly one block's shared memory. Slow, but exact: for small shapes in tests and for debugging.
#pragma once

#include <array>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace emu {
inline thread_local dim3 thread_index;
inline thread_local dim3 block_index;
inline dim3 block_dim;
inline dim3 grid_dim;
inline std::barrier<>* block_barrier = nullptr;
inline std::vector<std::unique_ptr<std::barrier<>>> warp_barriers;
inline std::vector<float> warp_exchange[2];  // [threads] one float per lane, two buffers used in turn
inline thread_local unsigned shuffle_parity = 0;
inline std::vector<std::array<uint32_t, 6>> lane_words;  // [threads] an mma's A and B registers
inline std::vector<const void*> lane_pointers;  // [threads] an ldmatrix's row addresses

inline unsigned linear_thread() {
    return thread_index.x + block_dim.x * (thread_index.y + block_dim.y * thread_index.z);
}

// Run kernel() as a CUDA launch of grid x block threads.
inline void launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    const unsigned threads = block.x * block.y * block.z;
    block_dim = block;
    grid_dim = grid;
    std::barrier<> barrier(threads);
    block_barrier = &barrier;
    warp_barriers.clear();
    for (unsigned w = 0; w < (threads + 31) / 32; ++w) {
        warp_barriers.push_back(std::make_unique<std::barrier<>>(std::min(32u, threads - 32 * w)));
    }
    warp_exchange[0].assign(threads, 0.0f);
    warp_exchange[1].assign(threads, 0.0f);
    lane_words.assign(threads, {});
    lane_pointers.assign(threads, nullptr);
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < threads; ++t) {
        workers.emplace_back([&, t] {
            thread_index = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            for (unsigned z = 0; z < grid.z; ++z)
                for (unsigned y = 0; y < grid.y; ++y)
                    for (unsigned x = 0; x < grid.x; ++x) {
                        block_index = {x, y, z};
                        kernel();
                        barrier.arrive_and_wait();  // the next block's shared memory is this block's
                    }
        });
    }
    for (auto& worker : workers) worker.join();
    block_barrier = nullptr;
}
}  // namespace emu

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(n)
#define threadIdx (emu::thread_index)
#define blockIdx (emu::block_index)
#define blockDim (emu::block_dim)
#define gridDim (emu::grid_dim)

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }

// CUDA's integer min/max are global device functions.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// Lane (lane_id ^ lane_mask)'s value. Every lane of the warp must call it, as with a full mask on a GPU (a
// diverged call deadlocks here, as it is undefined there). Two exchange buffers used in turn need one barrier
// per shuffle: a lane can only write a buffer again after the next barrier, which every lane reaches after
// reading it.
inline float __shfl_xor_sync(unsigned /*mask*/, float value, int lane_mask, int width = 32) {
    const unsigned me = emu::linear_thread();
    const unsigned warp = me / 32;
    std::vector<float>& exchange = emu::warp_exchange[emu::shuffle_parity];
    emu::shuffle_parity ^= 1u;
    exchange[me] = value;
    emu::warp_barriers[warp]->arrive_and_wait();
    const unsigned lane = me % 32;
    unsigned other = lane ^ static_cast<unsigned>(lane_mask);
    if (other / static_cast<unsigned>(width) != lane / static_cast<unsigned>(width)) other = lane;  // outside the segment
    return exchange[warp * 32 + other];
}

// fp16 and bf16 as their bits; arithmetic happens in float, as the kernels do.
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __half2float(__half h) {
    _Float16 value;
    std::memcpy(&value, &h.bits, 2);
    return static_cast<float>(value);
}
inline __half __float2half_rn(float f) {
    const _Float16 value = static_cast<_Float16>(f);  // round to nearest even
    __half h;
    std::memcpy(&h.bits, &value, 2);
    return h;
}
inline float __bfloat162float(__nv_bfloat16 b) {
    const uint32_t bits = static_cast<uint32_t>(b.bits) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    __nv_bfloat16 b;
    if (std::isnan(f)) {
        b.bits = 0x7fc0;
        return b;
    }
    bits += 0x7fff + ((bits >> 16) & 1);  // round to nearest even
    b.bits = static_cast<uint16_t>(bits >> 16);
    return b;
}

struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

inline void __syncwarp(unsigned /*mask*/ = 0xffffffffu) {
    emu::warp_barriers[emu::linear_thread() / 32]->arrive_and_wait();
}

namespace emu {
template <typename T>
inline float half_of(uint32_t word, int high) {  // one 16-bit element of a fragment register
    T value;
    const uint16_t bits = static_cast<uint16_t>(high ? word >> 16 : word & 0xffffu);
    std::memcpy(&value, &bits, 2);
    if constexpr (sizeof(T) == 2 && std::is_same_v<T, __half>) return __half2float(value);
    else return __bfloat162float(value);
}
}  // namespace emu

// D = A B + D for one warp: A 16x16 (row), B 16x8 (col), D 16x8 fp32. Lane l = 4 groupID + threadID_in_group
// holds a_i at row groupID (+8 for i = 2, 3, 6, 7), column 2 threadID_in_group + i % 2 (+8 for i >= 4); b_i at
// row 2 threadID_in_group + i % 2 (+8 for i >= 2), column groupID; d_i at row groupID (+8 for i >= 2), column
// 2 threadID_in_group + i % 2. Two elements to a register, the lower index in the low half.
template <typename T>
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    const unsigned me = emu::linear_thread(), warp = me / 32, lane = me % 32;
    emu::lane_words[me] = {a[0], a[1], a[2], a[3], b0, b1};
    __syncwarp();
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; ++l) {
        const auto& w = emu::lane_words[warp * 32 + l];
        const int group = l / 4, thread = l % 4;
        for (int i = 0; i < 8; ++i)
            A[group + 8 * ((i / 2) % 2)][2 * thread + i % 2 + 8 * (i / 4)] = emu::half_of<T>(w[i / 2], i % 2);
        for (int i = 0; i < 4; ++i) B[2 * thread + i % 2 + 8 * (i / 2)][group] = emu::half_of<T>(w[4 + i / 2], i % 2);
    }
    __syncwarp();  // every lane has read the operands before any writes the next ones
    const int group = lane / 4, thread = lane % 4;
    for (int i = 0; i < 4; ++i) {
        const int row = group + 8 * (i / 2), column = 2 * thread + i % 2;
        float sum = 0.0f;
        for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][column];
        d[i] += sum;
    }
}

// Four 8x8 matrices of 16-bit elements from shared memory, transposed: lanes 8m .. 8m + 7 give the addresses of
// matrix m's rows; lane l receives, of each matrix, the elements (row 2 (l % 4), column l / 4) and (row 2 (l % 4)
// + 1, column l / 4).
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
    const unsigned me = emu::linear_thread(), warp = me / 32, lane = me % 32;
    emu::lane_pointers[me] = row;
    __syncwarp();
    for (int m = 0; m < 4; ++m) {
        const auto* first = static_cast<const uint16_t*>(emu::lane_pointers[warp * 32 + 8 * m + 2 * (lane % 4)]);
        const auto* second = static_cast<const uint16_t*>(emu::lane_pointers[warp * 32 + 8 * m + 2 * (lane % 4) + 1]);
        r[m] = static_cast<uint32_t>(first[lane / 4]) | static_cast<uint32_t>(second[lane / 4]) << 16;
    }
    __syncwarp();
}

inline void cp_async_16(void* shared, const void* global, bool valid) {
    if (valid) std::memcpy(shared, global, 16);
    else std::memset(shared, 0, 16);
}
inline void cp_async_commit() {}
template <int N>
inline void cp_async_wait() {}
