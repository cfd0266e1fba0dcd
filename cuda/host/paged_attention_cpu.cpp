// Decode paged attention on the CPU, in one pass over K/V: the algorithm of ../paged_attention.cu for a CPU core.
//
// Work items are (sequence, kv head) pairs, spread over `threads` OS threads (a long sequence's pairs go to
// different threads). Per item, the item's block table is walked block by block: every K row of the block is
// dotted with the group's query heads (fp32, head_dim in the innermost loop so the compiler vectorizes it), the
// block's logits raise the running max once, the accumulators are rescaled once, and the block's V rows are added
// with their weights. Positions past the sequence's end are never read (stale cache memory may hold NaN). No
// gathered copy of K or V exists: each byte is read once, from where the pool holds it.
//
// An fp8 cache (e4m3 or e5m2, fp8.h) is widened through a 256-entry table; its kv head's scales are folded in
// where they cost nothing: k_scale into the query's scale, v_scale into the output (the same algebra as the CUDA
// kernels'; the reference dequantizes every element instead, which rounds differently by a few fp32 ulps).
//
// Build: g++ -std=c++20 -O3 -march=native -fopenmp-simd -shared -fPIC -pthread paged_attention_cpu.cpp
// (dataplane/native.py; -fopenmp-simd lets the dot products' sums be vectorized, nothing else changes).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <type_traits>
#include <vector>

#include "fp8.h"

namespace {

// Element types, as native.py numbers them.
enum Kind { F32 = 0, F16 = 1, BF16 = 2, E4M3 = 3, E5M2 = 4 };

template <Kind K>
using Storage = std::conditional_t<K == F32, float, std::conditional_t<K == F16 || K == BF16, uint16_t, uint8_t>>;

// Every fp8 bit pattern as a float, once.
template <Kind K>
const float* fp8_table() {
    static const auto table = [] {
        std::vector<float> values(256);
        for (int bits = 0; bits < 256; ++bits) values[bits] = fp8::to_float(bits, K == E4M3 ? fp8::E4M3 : fp8::E5M2);
        return values;
    }();
    return table.data();
}

// A row of head_dim elements as floats: float copied, bf16 widened (its bits are a float's upper half), fp16
// converted, fp8 looked up.
template <Kind K>
inline void row_to_float(const Storage<K>* row, float* out, int head_dim) {
    if constexpr (K == F32) {
        std::memcpy(out, row, head_dim * sizeof(float));
    } else if constexpr (K == BF16) {
        for (int d = 0; d < head_dim; ++d) {
            const uint32_t bits = static_cast<uint32_t>(row[d]) << 16;
            std::memcpy(&out[d], &bits, 4);
        }
    } else if constexpr (K == F16) {
        for (int d = 0; d < head_dim; ++d) {
            _Float16 h;
            std::memcpy(&h, &row[d], 2);
            out[d] = static_cast<float>(h);
        }
    } else {
        const float* table = fp8_table<K>();
        for (int d = 0; d < head_dim; ++d) out[d] = table[row[d]];
    }
}

// Q: the query's element type, C: the caches'. k_scale, v_scale: [num_kv_heads], or null (not quantized: 1).
template <Kind Q, Kind C>
void attend(const void* query_bytes, const void* key_bytes, const void* value_bytes, const int* block_tables,
            const int* seq_lens, const float* k_scale, const float* v_scale, float* out, int batch,
            int num_kv_heads, int group, int block_size, int head_dim, int max_blocks, float scale, int threads) {
    const auto* query = static_cast<const Storage<Q>*>(query_bytes);
    const auto* key_cache = static_cast<const Storage<C>*>(key_bytes);
    const auto* value_cache = static_cast<const Storage<C>*>(value_bytes);
    const int items = batch * num_kv_heads;
    std::atomic<int> next{0};
    auto worker = [&] {
        std::vector<float> q(group * head_dim), acc(group * head_dim), logits(group * block_size),
            row(head_dim), m(group), l(group);
        for (int item = next++; item < items; item = next++) {
            const int seq = item / num_kv_heads, kv_head = item % num_kv_heads;
            const int length = seq_lens[seq];
            const float q_scale = k_scale ? scale * k_scale[kv_head] : scale;
            for (int g = 0; g < group; ++g) {
                const auto* qrow =
                    query + ((int64_t)seq * num_kv_heads * group + (int64_t)kv_head * group + g) * head_dim;
                row_to_float<Q>(qrow, &q[g * head_dim], head_dim);
                for (int d = 0; d < head_dim; ++d) q[g * head_dim + d] *= q_scale;
                m[g] = -INFINITY;
                l[g] = 0.0f;
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int first = 0; first < length; first += block_size) {
                const int64_t block = block_tables[(int64_t)seq * max_blocks + first / block_size];
                const int tokens = std::min(block_size, length - first);
                const int64_t slab = (block * num_kv_heads + kv_head) * block_size * head_dim;
                const auto* keys = key_cache + slab;
                const auto* values = value_cache + slab;
                for (int t = 0; t < tokens; ++t) {
                    row_to_float<C>(keys + (int64_t)t * head_dim, row.data(), head_dim);
                    for (int g = 0; g < group; ++g) {
                        const float* qg = &q[g * head_dim];
                        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
                        for (int d = 0; d < head_dim; ++d) dot += qg[d] * row[d];
                        logits[g * block_size + t] = dot;
                    }
                }
                for (int g = 0; g < group; ++g) {
                    float block_max = -INFINITY;
                    for (int t = 0; t < tokens; ++t) block_max = std::max(block_max, logits[g * block_size + t]);
                    const float new_max = std::max(m[g], block_max);
                    const float correction = std::exp(m[g] - new_max);  // 0 on the first block
                    l[g] *= correction;
                    for (int d = 0; d < head_dim; ++d) acc[g * head_dim + d] *= correction;
                    for (int t = 0; t < tokens; ++t) {
                        const float p = std::exp(logits[g * block_size + t] - new_max);
                        logits[g * block_size + t] = p;
                        l[g] += p;
                    }
                    m[g] = new_max;
                }
                for (int t = 0; t < tokens; ++t) {
                    row_to_float<C>(values + (int64_t)t * head_dim, row.data(), head_dim);
                    for (int g = 0; g < group; ++g) {
                        const float p = logits[g * block_size + t];
                        float* a = &acc[g * head_dim];
                        for (int d = 0; d < head_dim; ++d) a[d] += p * row[d];
                    }
                }
            }
            for (int g = 0; g < group; ++g) {
                float* o = out + ((int64_t)seq * num_kv_heads * group + (int64_t)kv_head * group + g) * head_dim;
                const float inverse = l[g] > 0.0f ? (v_scale ? v_scale[kv_head] : 1.0f) / l[g] : 0.0f;  // 0: not 0/0
                for (int d = 0; d < head_dim; ++d) o[d] = acc[g * head_dim + d] * inverse;
            }
        }
    };
    std::vector<std::thread> pool;
    for (int i = 1; i < std::min(threads, items); ++i) pool.emplace_back(worker);
    worker();
    for (auto& thread : pool) thread.join();
}

template <Kind Q>
void attend_query(int cache_kind, const void* query, const void* key_cache, const void* value_cache,
                  const int* block_tables, const int* seq_lens, const float* k_scale, const float* v_scale,
                  float* out, int batch, int num_kv_heads, int group, int block_size, int head_dim, int max_blocks,
                  float scale, int threads) {
    auto run = [&](auto kernel) {
        kernel(query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale, out, batch, num_kv_heads,
               group, block_size, head_dim, max_blocks, scale, threads);
    };
    if (cache_kind == E4M3)
        run(attend<Q, E4M3>);
    else if (cache_kind == E5M2)
        run(attend<Q, E5M2>);
    else
        run(attend<Q, Q>);
}

}  // namespace

// query_kind: 0 float32, 1 float16, 2 bfloat16; cache_kind: the same as the query's, or 3 fp8 e4m3, 4 fp8 e5m2
// (then k_scale and v_scale [num_kv_heads] are given; otherwise null). out is always float32.
extern "C" void paged_attention_cpu(const void* query,         // [batch, num_kv_heads * group, head_dim]
                                    const void* key_cache,     // [num_blocks, num_kv_heads, block_size, head_dim]
                                    const void* value_cache,   // [num_blocks, num_kv_heads, block_size, head_dim]
                                    const int* block_tables,   // [batch, max_blocks]
                                    const int* seq_lens,       // [batch]
                                    const float* k_scale,      // [num_kv_heads] or null
                                    const float* v_scale,      // [num_kv_heads] or null
                                    float* out,                // [batch, num_kv_heads * group, head_dim]
                                    int batch, int num_kv_heads, int group, int block_size, int head_dim,
                                    int max_blocks, float scale, int threads, int query_kind, int cache_kind) {
    if (query_kind == F32)
        attend_query<F32>(cache_kind, query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale, out,
                          batch, num_kv_heads, group, block_size, head_dim, max_blocks, scale, threads);
    else if (query_kind == F16)
        attend_query<F16>(cache_kind, query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale, out,
                          batch, num_kv_heads, group, block_size, head_dim, max_blocks, scale, threads);
    else
        attend_query<BF16>(cache_kind, query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale,
                           out, batch, num_kv_heads, group, block_size, head_dim, max_blocks, scale, threads);
}
