// The kernels under a sanitizer (tests/dataplane/test_sanitizers.py builds this with -fsanitize=thread or =address):
// the emulated CUDA kernels (a library of cuda/emulation's bf16 head_dim 128 subset, linked in: the emulation poisons
// its library's .bss as shared memory, so it must not be this program's) or, with -DNATIVE, the native CPU kernel
// (cuda/host/paged_attention_cpu.cpp), over the edge cases: sequences of length 0 and 1, block sizes 1 and 128,
// a sequence that ends in the last block of the pool (every buffer is allocated to its exact size, so a read past
// it is a heap overflow), with and without split-K. Each output is checked against a naive loop. Prints "ok N" and
// exits 0, or names the first mismatch and exits 1. `quick` runs the first cases only (the ThreadSanitizer build).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#ifdef NATIVE
#include "../../cuda/host/paged_attention_cpu.cpp"
#else
#define EMU_ATTENTION(NAME)                                                                                      \
    extern "C" void NAME(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, uint16_t*, const uint16_t*,  \
                         const uint16_t*, const uint16_t*, const int*, const int*, const float*, const float*,   \
                         float*, float*, float*, float, int, int, int, int, int, int);
EMU_ATTENTION(emu_paged_attention_tc_bf16_hd128)
EMU_ATTENTION(emu_paged_attention_bf16_hd128_g8)
extern "C" void emu_paged_attention_merge_bf16_hd128(unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                                     uint16_t*, const float*, const float*, const float*, const int*,
                                                     int, int, int);
extern "C" const char* emu_take_error();
#endif

namespace {
constexpr int HEAD_DIM = 128, NUM_KV_HEADS = 2;

uint16_t to_bf16(float x) {  // round to nearest even (finite inputs)
    uint32_t bits;
    std::memcpy(&bits, &x, 4);
    return static_cast<uint16_t>((bits + 0x7fff + ((bits >> 16) & 1)) >> 16);
}
float from_bf16(uint16_t b) {
    const uint32_t bits = static_cast<uint32_t>(b) << 16;
    float x;
    std::memcpy(&x, &bits, 4);
    return x;
}

struct Case {
    int block_size, group;
    std::vector<int> seq_lens;
    int tokens_per_split;  // 0: one split
};

// Softmax(q K^T scale) V of every (sequence, query head), token by token through the block table.
std::vector<float> naive(const std::vector<uint16_t>& query, const std::vector<uint16_t>& key,
                         const std::vector<uint16_t>& value, const std::vector<int>& tables, const Case& c,
                         int max_blocks, float scale) {
    const int num_q_heads = NUM_KV_HEADS * c.group, batch = static_cast<int>(c.seq_lens.size());
    std::vector<float> out(static_cast<size_t>(batch) * num_q_heads * HEAD_DIM, 0.0f);
    for (int s = 0; s < batch; ++s)
        for (int h = 0; h < num_q_heads; ++h) {
            const int n = c.seq_lens[s], kv = h / c.group;
            std::vector<float> logits(n);
            float top = -INFINITY;
            auto row = [&](int t) {
                const int64_t block = tables[s * max_blocks + t / c.block_size];
                return ((block * NUM_KV_HEADS + kv) * c.block_size + t % c.block_size) * HEAD_DIM;
            };
            for (int t = 0; t < n; ++t) {
                float dot = 0.0f;
                for (int d = 0; d < HEAD_DIM; ++d)
                    dot += from_bf16(query[(s * num_q_heads + h) * HEAD_DIM + d]) * from_bf16(key[row(t) + d]);
                logits[t] = dot * scale;
                top = std::max(top, logits[t]);
            }
            float total = 0.0f;
            for (int t = 0; t < n; ++t) total += logits[t] = std::exp(logits[t] - top);
            for (int t = 0; t < n; ++t)
                for (int d = 0; d < HEAD_DIM; ++d)
                    out[(s * num_q_heads + h) * HEAD_DIM + d] += logits[t] / total * from_bf16(value[row(t) + d]);
        }
    return out;
}

// Every sequence's blocks in a row, the last sequence's last one the pool's last; tables padded with -1.
int run(const Case& c, const char* kernel) {
    const int batch = static_cast<int>(c.seq_lens.size()), num_q_heads = NUM_KV_HEADS * c.group;
    int max_blocks = 1, num_blocks = 0;
    for (int n : c.seq_lens) {
        max_blocks = std::max(max_blocks, (n + c.block_size - 1) / c.block_size + 1);
        num_blocks += (n + c.block_size - 1) / c.block_size;
    }
    std::vector<int> tables(static_cast<size_t>(batch) * max_blocks, -1);
    for (int s = 0, next = 0; s < batch; ++s)
        for (int b = 0; b < (c.seq_lens[s] + c.block_size - 1) / c.block_size; ++b) tables[s * max_blocks + b] = next++;
    std::mt19937 random(7);
    std::normal_distribution<float> normal;
    const size_t cache_size = static_cast<size_t>(num_blocks) * NUM_KV_HEADS * c.block_size * HEAD_DIM;
    std::vector<uint16_t> key(cache_size), value(cache_size), query(static_cast<size_t>(batch) * num_q_heads * HEAD_DIM);
    for (auto* v : {&key, &value, &query})
        for (auto& x : *v) x = to_bf16(normal(random));
    const float scale = 0.088f;
    const std::vector<float> expected = naive(query, key, value, tables, c, max_blocks, scale);
    std::vector<float> out(expected.size());
#ifdef NATIVE
    paged_attention_cpu(query.data(), key.data(), value.data(), tables.data(), c.seq_lens.data(), nullptr, nullptr,
                        out.data(), batch, NUM_KV_HEADS, c.group, c.block_size, HEAD_DIM, max_blocks, scale, 4,
                        BF16, BF16);  // (no k/v scales: a 16-bit cache)
    const float tolerance = 1e-4f;
#else
    const int longest = *std::max_element(c.seq_lens.begin(), c.seq_lens.end());
    const int splits = c.tokens_per_split ? std::max(1, (longest + c.tokens_per_split - 1) / c.tokens_per_split) : 1;
    const int per_split = c.tokens_per_split ? c.tokens_per_split : std::max(longest, 1);
    std::vector<uint16_t> result(expected.size());
    const size_t parts = splits > 1 ? static_cast<size_t>(batch) * num_q_heads * splits : 1;
    std::vector<float> tmp_out(splits > 1 ? parts * HEAD_DIM : 1), tmp_max(parts), tmp_sum(parts);
    const uint16_t *q = query.data(), *k = key.data(), *v = value.data();
    const unsigned b = static_cast<unsigned>(batch), s = static_cast<unsigned>(splits);
    if (std::strcmp(kernel, "tensor-core") == 0)
        emu_paged_attention_tc_bf16_hd128(NUM_KV_HEADS, b, s, 128, 1, 1, result.data(), q, k, v, tables.data(),
                                          c.seq_lens.data(), nullptr, nullptr, tmp_out.data(), tmp_max.data(),
                                          tmp_sum.data(), scale, NUM_KV_HEADS, c.group, c.block_size, max_blocks,
                                          per_split, splits);
    else
        emu_paged_attention_bf16_hd128_g8(NUM_KV_HEADS, b, s, 128, 1, 1, result.data(), q, k, v, tables.data(),
                                          c.seq_lens.data(), nullptr, nullptr, tmp_out.data(), tmp_max.data(),
                                          tmp_sum.data(), scale, NUM_KV_HEADS, c.group, c.block_size, max_blocks,
                                          per_split, splits);
    if (splits > 1)
        emu_paged_attention_merge_bf16_hd128(num_q_heads, b, 1, HEAD_DIM, 1, 1, result.data(), tmp_out.data(),
                                             tmp_max.data(), tmp_sum.data(), c.seq_lens.data(), num_q_heads, splits,
                                             per_split);
    const char* error = emu_take_error();
    if (*error) {
        std::printf("%s, block size %d: %s\n", kernel, c.block_size, error);
        return 1;
    }
    for (size_t i = 0; i < out.size(); ++i) out[i] = from_bf16(result[i]);
    const float tolerance = 2e-2f;  // bf16 output (and P in bf16 on tensor cores) of O(1) values
#endif
    for (size_t i = 0; i < out.size(); ++i)
        if (!(std::fabs(out[i] - expected[i]) <= tolerance)) {
            std::printf("%s, block size %d, group %d: element %zu is %g, expected %g\n", kernel, c.block_size,
                        c.group, i, out[i], expected[i]);
            return 1;
        }
    return 0;
}
}  // namespace

int main(int argc, char** argv) {
    const bool quick = argc > 1 && std::strcmp(argv[1], "quick") == 0;
    const std::vector<Case> cases = {
        {16, 4, {0, 1, 17, 70}, 0},
        {1, 3, {33, 0, 1}, 32},
        {128, 8, {128, 1, 257}, 0},
        {128, 1, {0, 300}, 64},
        {16, 2, {0, 0}, 0},
    };
    int checked = 0;
    for (size_t i = 0; i < (quick ? 2 : cases.size()); ++i) {
#ifdef NATIVE
        if (run(cases[i], "native")) return 1;
        ++checked;
#else
        for (const char* kernel : {"simple", "tensor-core"}) {
            if (run(cases[i], kernel)) return 1;
            ++checked;
        }
#endif
    }
    std::printf("ok %d\n", checked);
    return 0;
}
