// Decode paged attention on the CPU, in one pass over K/V: the algorithm of ../paged_attention.cu for a CPU core.
//
// Work items are (sequence, kv head) pairs, spread over `threads` OS threads (a long sequence's pairs go to
// different threads). Per item, the item's block table is walked block by block: every K row of the block is
// dotted with the group's query heads (fp32, head_dim in the innermost loop so the compiler vectorizes it), the
// block's logits raise the running max once, the accumulators are rescaled once, and the block's V rows are added
// with their weights. Positions past the sequence's end are never read (stale cache memory may hold NaN). No
// gathered copy of K or V exists: each byte is read once, from where the pool holds it.
//
// Build: g++ -std=c++20 -O3 -march=native -fopenmp-simd -shared -fPIC -pthread paged_attention_cpu.cpp
// (dataplane/native.py; -fopenmp-simd lets the dot products' sums be vectorized, nothing else changes).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

namespace {

// A row of head_dim elements as floats: float copied, bf16 widened (its bits are a float's upper half), fp16
// converted.
template <typename T, bool BF16>
inline void row_to_float(const T* row, float* out, int head_dim) {
    if constexpr (sizeof(T) == 4) {
        std::memcpy(out, row, head_dim * sizeof(float));
    } else if constexpr (BF16) {
        for (int d = 0; d < head_dim; ++d) {
            const uint32_t bits = static_cast<uint32_t>(row[d]) << 16;
            std::memcpy(&out[d], &bits, 4);
        }
    } else {
        for (int d = 0; d < head_dim; ++d) {
            _Float16 h;
            std::memcpy(&h, &row[d], 2);
            out[d] = static_cast<float>(h);
        }
    }
}

template <typename T, bool BF16>
void attend(const T* query, const T* key_cache, const T* value_cache, const int* block_tables, const int* seq_lens,
            float* out, int batch, int num_kv_heads, int group, int block_size, int head_dim, int max_blocks,
            float scale, int threads) {
    const int items = batch * num_kv_heads;
    std::atomic<int> next{0};
    auto worker = [&] {
        std::vector<float> q(group * head_dim), acc(group * head_dim), logits(group * block_size),
            row(head_dim), m(group), l(group);
        for (int item = next++; item < items; item = next++) {
            const int seq = item / num_kv_heads, kv_head = item % num_kv_heads;
            const int length = seq_lens[seq];
            for (int g = 0; g < group; ++g) {
                const T* qrow = query + ((int64_t)seq * num_kv_heads * group + (int64_t)kv_head * group + g) * head_dim;
                row_to_float<T, BF16>(qrow, &q[g * head_dim], head_dim);
                for (int d = 0; d < head_dim; ++d) q[g * head_dim + d] *= scale;
                m[g] = -INFINITY;
                l[g] = 0.0f;
            }
            std::fill(acc.begin(), acc.end(), 0.0f);
            for (int first = 0; first < length; first += block_size) {
                const int64_t block = block_tables[(int64_t)seq * max_blocks + first / block_size];
                const int tokens = std::min(block_size, length - first);
                const int64_t slab = (block * num_kv_heads + kv_head) * block_size * head_dim;
                const T* keys = key_cache + slab;
                const T* values = value_cache + slab;
                for (int t = 0; t < tokens; ++t) {
                    row_to_float<T, BF16>(keys + (int64_t)t * head_dim, row.data(), head_dim);
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
                    row_to_float<T, BF16>(values + (int64_t)t * head_dim, row.data(), head_dim);
                    for (int g = 0; g < group; ++g) {
                        const float p = logits[g * block_size + t];
                        float* a = &acc[g * head_dim];
                        for (int d = 0; d < head_dim; ++d) a[d] += p * row[d];
                    }
                }
            }
            for (int g = 0; g < group; ++g) {
                float* o = out + ((int64_t)seq * num_kv_heads * group + (int64_t)kv_head * group + g) * head_dim;
                const float inverse = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;  // length 0: zeros, not 0/0
                for (int d = 0; d < head_dim; ++d) o[d] = acc[g * head_dim + d] * inverse;
            }
        }
    };
    std::vector<std::thread> pool;
    for (int i = 1; i < std::min(threads, items); ++i) pool.emplace_back(worker);
    worker();
    for (auto& thread : pool) thread.join();
}

}  // namespace

// dtype: 0 float32, 1 float16, 2 bfloat16 (query and caches alike; out is always float32).
extern "C" void paged_attention_cpu(const void* query,         // [batch, num_kv_heads * group, head_dim]
                                    const void* key_cache,     // [num_blocks, num_kv_heads, block_size, head_dim]
                                    const void* value_cache,   // [num_blocks, num_kv_heads, block_size, head_dim]
                                    const int* block_tables,   // [batch, max_blocks]
                                    const int* seq_lens,       // [batch]
                                    float* out,                // [batch, num_kv_heads * group, head_dim]
                                    int batch, int num_kv_heads, int group, int block_size, int head_dim,
                                    int max_blocks, float scale, int threads, int dtype) {
    const auto* q16 = static_cast<const uint16_t*>(query);
    const auto* k16 = static_cast<const uint16_t*>(key_cache);
    const auto* v16 = static_cast<const uint16_t*>(value_cache);
    if (dtype == 0)
        attend<float, false>(static_cast<const float*>(query), static_cast<const float*>(key_cache),
                             static_cast<const float*>(value_cache), block_tables, seq_lens, out, batch, num_kv_heads,
                             group, block_size, head_dim, max_blocks, scale, threads);
    else if (dtype == 1)
        attend<uint16_t, false>(q16, k16, v16, block_tables, seq_lens, out, batch, num_kv_heads, group, block_size,
                                head_dim, max_blocks, scale, threads);
    else
        attend<uint16_t, true>(q16, k16, v16, block_tables, seq_lens, out, batch, num_kv_heads, group, block_size,
                               head_dim, max_blocks, scale, threads);
}
