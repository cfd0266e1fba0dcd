// A CPU emulation of the parts of CUDA that minipaged's kernels use, so that the same .cu source runs on the
// CPU in CI: grid and block indices, __shared__ memory per block, __syncthreads and __syncwarp, warp shuffles, the
// fp16 / bf16 / fp8 types with their conversions, and the warp-level instructions of paged_attention_tc.cu: mma.sync
// m16n8k16 (fp32 accumulation), ldmatrix .x4 .trans and cp.async. The collective ones gather every lane's operands
// and give each lane its part by the PTX ISA's fragment layouts.
//
// It keeps the GPU's rules, not the CPU's, so that a kernel that forgets a barrier fails here as it would there:
//   - cp.async copies are deferred per thread in commit groups: the data lands when that thread's
//     cp.async.wait_group retires the group, and other threads may read it only after the next __syncwarp (same
//     warp) or __syncthreads that follows the landing. An ldmatrix that reads 16 bytes still in flight, or landed
//     by another lane with no ordering barrier since, is an error; so is a copy still pending when a thread exits.
//   - Only one warp of a block runs at a time, in a seeded random order, switching at __syncthreads (and when a
//     warp exits): a warp that reads another warp's shared-memory writes without a __syncthreads between them
//     reads what was there before, which is NaN (every byte 0xff: NaN in float, fp16 and bf16; -1 in integers)
//     until written, because shared memory is poisoned before every block. Blocks run in a seeded random order.
//   - Collectives (shuffles, mma, ldmatrix, __syncwarp) exchange register operands and order no memory. Each is
//     tagged with its call site: every lane its mask names must reach the same one (and __syncthreads the same
//     one across the block), else the launch fails naming both sites, where a GPU would hang or compute garbage.
//   - __shfl_*_sync with PTX's mask and width semantics; a source lane outside the mask gives NaN (undefined).
//   - 16-byte alignment is asserted where PTX requires it (cp.async, ldmatrix rows).
// A broken rule stops the launch in every thread; emu_take_error() (called by the Python side after every launch)
// returns the message. Every CUDA thread of a block is an OS thread, so the lanes of the running warp do run
// concurrently (the ThreadSanitizer build adds random yields at every synchronisation point). Slow, but exact: for
// small shapes in tests and for debugging. What it cannot see (the order of plain stores within a warp between
// __syncwarps, global-memory races between blocks) is listed in the README's kernel section.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <dlfcn.h>
#include <functional>
#include <limits>
#include <link.h>
#include <memory>
#include <mutex>
#include <random>
#include <source_location>
#include <string>
#include <thread>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "../host/fp8.h"

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

namespace emu {
using Site = std::source_location;
constexpr unsigned FULL_MASK = 0xffffffffu;

// Thrown in every thread of a launch once a rule is broken, so that none waits forever at a barrier.
struct Abort {};

struct Copy {  // one cp.async: its 16 bytes are read at issue and land at the issuing thread's wait_group
    unsigned char* target;
    std::array<unsigned char, 16> data;
    Site site;
};

struct Landing {  // the last cp.async into a 16-byte piece of shared memory
    bool pending;
    unsigned thread, warp, epoch, block_generation;  // who landed it, and the ordering barriers passed by then
    Site site;
};

struct Rendezvous {  // the warp collective its lanes are arriving at
    unsigned arrived = 0, mask = 0, first_lane = 0;
    std::atomic<unsigned> generation = 0;  // waiting lanes sleep on it, without the mutex: one wake-up each
    const char* kind = nullptr;
    Site site;
};

struct Warp {
    std::condition_variable wake;
    unsigned lanes = 0, live = 0, at_barrier = 0;
    unsigned epoch = 0;  // ordering barriers (__syncwarp, __syncthreads) this warp has passed in the block
    Rendezvous rendezvous;
};

struct Launch {
    dim3 grid, block;
    unsigned threads = 0, num_warps = 0;
    std::mutex mutex;
    std::unique_ptr<Warp[]> warps;
    std::vector<dim3> order;  // the blocks, in the order they run
    size_t block_number = 0;
    unsigned running_warp = 0, block_generation = 0;
    Site barrier_site;
    unsigned barrier_arrived = 0;
    std::mt19937_64 random;
    std::unordered_map<uintptr_t, Landing> landings;  // by 16-byte-aligned shared address
    std::vector<std::vector<Copy>> uncommitted;           // [threads]
    std::vector<std::deque<std::vector<Copy>>> committed;  // [threads] groups, oldest first
    // Collective operands and results, one slot per thread.
    std::vector<float> values, shuffled;
    std::vector<std::array<uint32_t, 6>> words;  // an mma's A and B registers
    std::vector<std::array<float, 4>> accumulators;
    std::vector<const void*> rows;              // an ldmatrix's row addresses
    std::vector<std::array<uint32_t, 4>> loaded;  // an ldmatrix's results
    std::string error;
    std::atomic<bool> aborted = false;
};

// The emulation's own state lives outside .bss: .bss is the kernels' __shared__ memory, poisoned before every block.
static Launch* current __attribute__((section("emu_state"))) = nullptr;
static std::string* last_error __attribute__((section("emu_state"))) = nullptr;
inline thread_local dim3 thread_index;
inline thread_local dim3 block_index;
inline thread_local unsigned me;  // this thread's linear index in its block

inline std::string where(const Site& site) {
    const char* file = std::strrchr(site.file_name(), '/');
    return std::string(file ? file + 1 : site.file_name()) + ":" + std::to_string(site.line());
}

inline std::string thread_name(unsigned thread) {
    return "thread " + std::to_string(thread) + " (warp " + std::to_string(thread / 32) + ", lane " +
           std::to_string(thread % 32) + ")";
}

// Record the first broken rule, wake every thread and unwind this one. Called with the launch's mutex held.
[[noreturn]] inline void fail(const std::string& message) {
    Launch& launch = *current;
    if (launch.error.empty()) {
        const dim3 b = block_index;
        launch.error = message + " [block (" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " +
                       std::to_string(b.z) + ")]";
    }
    launch.aborted = true;
    for (unsigned w = 0; w < launch.num_warps; ++w) {
        launch.warps[w].wake.notify_all();
        launch.warps[w].rendezvous.generation.fetch_add(1, std::memory_order_release);
        launch.warps[w].rendezvous.generation.notify_all();
    }
    throw Abort{};
}

inline void maybe_yield() {
#ifdef EMU_RANDOM_YIELDS
    thread_local std::minstd_rand random(std::hash<std::thread::id>{}(std::this_thread::get_id()));
    if (random() % 2) std::this_thread::yield();
#endif
}

inline bool same_site(const Site& a, const Site& b) {
    return a.line() == b.line() && a.column() == b.column() && std::strcmp(a.file_name(), b.file_name()) == 0;
}

// The writable, zero-initialised memory of this library: the kernels' __shared__ variables.
inline std::pair<unsigned char*, unsigned char*> shared_memory() {
    Dl_info info;
    dladdr(reinterpret_cast<void*>(&shared_memory), &info);
    std::pair<ElfW(Addr), std::pair<unsigned char*, unsigned char*>> found{
        reinterpret_cast<ElfW(Addr)>(info.dli_fbase), {nullptr, nullptr}};
    dl_iterate_phdr(
        [](dl_phdr_info* object, size_t, void* data) {
            auto& [base, range] = *static_cast<decltype(found)*>(data);
            if (object->dlpi_addr != base) return 0;
            for (int i = 0; i < object->dlpi_phnum; ++i) {
                const ElfW(Phdr)& segment = object->dlpi_phdr[i];
                if (segment.p_type == PT_LOAD && (segment.p_flags & PF_W) && segment.p_memsz > segment.p_filesz) {
                    auto* start = reinterpret_cast<unsigned char*>(object->dlpi_addr + segment.p_vaddr);
                    range = {start + segment.p_filesz, start + segment.p_memsz};
                }
            }
            return 1;
        },
        &found);
    return found.second;
}

// A fresh block: every warp runnable, shared memory poisoned, no copy in flight. Called with the mutex held.
inline void start_block(Launch& launch) {
    static_assert(sizeof(float) == 4);
    const auto [begin, end] = shared_memory();
    if (begin) std::memset(begin, 0xff, end - begin);
    launch.landings.clear();
    launch.block_generation = 0;
    launch.barrier_arrived = 0;
    for (unsigned w = 0; w < launch.num_warps; ++w) {
        Warp& warp = launch.warps[w];
        warp.live = warp.lanes;
        warp.at_barrier = warp.epoch = 0;
        warp.rendezvous.arrived = 0;
    }
    launch.running_warp = static_cast<unsigned>(launch.random() % launch.num_warps);
    launch.warps[launch.running_warp].wake.notify_all();
}

// The running warp can go no further (all its live threads wait at __syncthreads, or have exited): run another
// one, chosen at random; complete the block barrier when every warp waits at it; start the next block when every
// thread has exited. Called with the mutex held.
inline void switch_warp(Launch& launch) {
    std::vector<unsigned> runnable, alive;
    for (unsigned w = 0; w < launch.num_warps; ++w) {
        const Warp& warp = launch.warps[w];
        if (warp.live > 0) alive.push_back(w);
        if (warp.live > warp.at_barrier) runnable.push_back(w);
    }
    if (runnable.empty() && !alive.empty()) {  // every thread left is at the barrier: it completes
        ++launch.block_generation;
        launch.barrier_arrived = 0;
        for (unsigned w : alive) {
            launch.warps[w].at_barrier = 0;
            ++launch.warps[w].epoch;
        }
        runnable = alive;
    }
    if (runnable.empty()) {
        if (++launch.block_number < launch.order.size()) start_block(launch);
        else
            for (unsigned w = 0; w < launch.num_warps; ++w) launch.warps[w].wake.notify_all();
        return;
    }
    launch.running_warp = runnable[launch.random() % runnable.size()];
    launch.warps[launch.running_warp].wake.notify_all();
}

// A warp collective: every lane `mask` names arrives at the same call site; the last one to arrive runs combine()
// for all of them. The lanes' operands are in their slots before, their results after.
template <typename Combine>
inline void collective(const char* kind, unsigned mask, const Site& site, Combine&& combine) {
    maybe_yield();
    Launch& launch = *current;
    std::unique_lock lock(launch.mutex);
    if (launch.aborted) throw Abort{};
    const unsigned lane = me % 32;
    Warp& warp = launch.warps[me / 32];
    const unsigned existing = warp.lanes == 32 ? FULL_MASK : (1u << warp.lanes) - 1;
    if (!(mask >> lane & 1u) || (mask & ~existing))
        fail(std::string(kind) + " at " + where(site) + ": mask " + std::to_string(mask) + " must name " +
             thread_name(me) + " and only lanes that exist");
    Rendezvous& rendezvous = warp.rendezvous;
    if (rendezvous.arrived == 0) {
        rendezvous.kind = kind;
        rendezvous.site = site;
        rendezvous.mask = mask;
        rendezvous.first_lane = lane;
    } else if (!same_site(rendezvous.site, site) || rendezvous.mask != mask) {
        fail("the lanes of warp " + std::to_string(me / 32) + " reach different collectives: lane " +
             std::to_string(rendezvous.first_lane) + " " + rendezvous.kind + " at " + where(rendezvous.site) +
             ", lane " + std::to_string(lane) + " " + kind + " at " + where(site) + " (a GPU would hang or " +
             "exchange garbage)");
    }
    if (++rendezvous.arrived == static_cast<unsigned>(std::popcount(mask))) {
        combine();
        rendezvous.arrived = 0;
        rendezvous.generation.fetch_add(1, std::memory_order_release);  // the results are written
        rendezvous.generation.notify_all();
    } else {
        const unsigned generation = rendezvous.generation.load(std::memory_order_relaxed);
        lock.unlock();
        rendezvous.generation.wait(generation, std::memory_order_acquire);
        if (launch.aborted) throw Abort{};
    }
}

// A thread has finished the block: a copy still in flight is an error.
inline void exit_block() {
    Launch& launch = *current;
    std::unique_lock lock(launch.mutex);
    if (launch.aborted) throw Abort{};
    size_t in_flight = launch.uncommitted[me].size();
    const Copy* copy = in_flight ? &launch.uncommitted[me].front() : nullptr;
    for (const auto& group : launch.committed[me]) {
        if (!copy && !group.empty()) copy = &group.front();
        in_flight += group.size();
    }
    if (copy)
        fail(thread_name(me) + " exits with " + std::to_string(in_flight) + " cp.async copies in flight (the first " +
             "issued at " + where(copy->site) + "): cp.async.wait_group must retire every group first");
    Warp& warp = launch.warps[me / 32];
    if (warp.rendezvous.arrived > 0 && (warp.rendezvous.mask >> (me % 32) & 1u))
        fail(thread_name(me) + " exits while lanes of its warp wait for it at " + warp.rendezvous.kind + " at " +
             where(warp.rendezvous.site));
    if (--warp.live == warp.at_barrier) switch_warp(launch);
}

// Run kernel() as a CUDA launch of grid x block threads (seeded by $MINIPAGED_EMULATION_SEED, default 0).
inline void launch(dim3 grid, dim3 block, const std::function<void()>& kernel) {
    Launch launch;
    launch.grid = grid;
    launch.block = block;
    launch.threads = block.x * block.y * block.z;
    launch.num_warps = (launch.threads + 31) / 32;
    launch.warps = std::make_unique<Warp[]>(launch.num_warps);
    for (unsigned w = 0; w < launch.num_warps; ++w) launch.warps[w].lanes = std::min(32u, launch.threads - 32 * w);
    const char* seed = std::getenv("MINIPAGED_EMULATION_SEED");
    launch.random.seed(seed ? std::strtoull(seed, nullptr, 10) : 0);
    for (unsigned z = 0; z < grid.z; ++z)
        for (unsigned y = 0; y < grid.y; ++y)
            for (unsigned x = 0; x < grid.x; ++x) launch.order.push_back({x, y, z});
    std::shuffle(launch.order.begin(), launch.order.end(), launch.random);
    launch.uncommitted.resize(launch.threads);
    launch.committed.resize(launch.threads);
    launch.values.assign(launch.threads, 0.0f);
    launch.shuffled.assign(launch.threads, 0.0f);
    launch.words.assign(launch.threads, {});
    launch.accumulators.assign(launch.threads, {});
    launch.rows.assign(launch.threads, nullptr);
    launch.loaded.assign(launch.threads, {});
    if (launch.order.empty() || launch.threads == 0) return;
    current = &launch;
    {
        std::lock_guard lock(launch.mutex);
        start_block(launch);
    }
    std::vector<std::thread> workers;
    for (unsigned t = 0; t < launch.threads; ++t) {
        workers.emplace_back([&, t] {
            me = t;
            thread_index = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            Warp& warp = launch.warps[t / 32];
            for (size_t b = 0; b < launch.order.size(); ++b) {
                {
                    std::unique_lock lock(launch.mutex);
                    warp.wake.wait(lock, [&] {
                        return launch.aborted || (launch.block_number == b && launch.running_warp == t / 32);
                    });
                    if (launch.aborted) return;
                }
                block_index = launch.order[b];
                try {
                    kernel();
                    exit_block();
                } catch (const Abort&) {
                    return;
                }
            }
        });
    }
    for (auto& worker : workers) worker.join();
    current = nullptr;
    if (!launch.error.empty()) {
        if (!last_error) last_error = new std::string;
        *last_error = launch.error;
    }
}

// 16 bytes of shared memory an ldmatrix reads: landed, and ordered after the landing for the whole warp.
inline void check_visible(const void* row, const Site& site, unsigned lane) {
    Launch& launch = *current;
    const auto address = reinterpret_cast<uintptr_t>(row);
    if (address % 16)
        fail("ldmatrix at " + where(site) + ": lane " + std::to_string(lane) + "'s row address is not 16-byte aligned");
    const auto found = launch.landings.find(address);
    if (found == launch.landings.end()) return;
    const Landing& landing = found->second;
    if (landing.pending)
        fail("ldmatrix at " + where(site) + " reads 16 bytes that " + thread_name(landing.thread) +
             "'s cp.async at " + where(landing.site) + " has not landed: its cp.async.wait_group has not retired "
             "that group yet");
    const bool ordered = landing.warp == me / 32 ? launch.warps[me / 32].epoch > landing.epoch
                                                 : launch.block_generation > landing.block_generation;
    if (!ordered)
        fail("ldmatrix at " + where(site) + " (lane " + std::to_string(lane) + ") reads 16 bytes that " +
             thread_name(landing.thread) + "'s cp.async at " + where(landing.site) + " landed with no __syncwarp " +
             "or __syncthreads since: other lanes may not see them yet");
}
}  // namespace emu

// The last error of a launch in this library ("" if none), cleared by reading it.
extern "C" const char* emu_take_error() {
    static thread_local std::string taken;
    taken = emu::last_error ? *emu::last_error : "";
    if (emu::last_error) emu::last_error->clear();
    return taken.c_str();
}

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(n)
#define threadIdx (emu::thread_index)
#define blockIdx (emu::block_index)
#define blockDim (emu::current->block)
#define gridDim (emu::current->grid)

inline void __syncthreads(const emu::Site& site = emu::Site::current()) {
    emu::maybe_yield();
    emu::Launch& launch = *emu::current;
    std::unique_lock lock(launch.mutex);
    if (launch.aborted) throw emu::Abort{};
    emu::Warp& warp = launch.warps[emu::me / 32];
    if (launch.barrier_arrived++ == 0) launch.barrier_site = site;
    else if (!emu::same_site(launch.barrier_site, site))
        emu::fail("threads of one block reach different __syncthreads: " + emu::where(launch.barrier_site) + " and " +
                  emu::where(site));
    if (warp.rendezvous.arrived > 0 && (warp.rendezvous.mask >> (emu::me % 32) & 1u))
        emu::fail("__syncthreads at " + emu::where(site) + " while lanes of warp " + std::to_string(emu::me / 32) +
                  " wait for this thread at " + warp.rendezvous.kind + " at " + emu::where(warp.rendezvous.site));
    const unsigned generation = launch.block_generation;
    if (++warp.at_barrier == warp.live) emu::switch_warp(launch);
    warp.wake.wait(lock, [&] {
        return launch.aborted || (launch.block_generation != generation && launch.running_warp == emu::me / 32);
    });
    if (launch.aborted) throw emu::Abort{};
}

// Orders the shared-memory accesses of the lanes in mask (only a full warp's __syncwarp counts as an ordering
// barrier for cp.async data here: the kernels use no other).
inline void __syncwarp(unsigned mask = emu::FULL_MASK, const emu::Site& site = emu::Site::current()) {
    emu::Warp& warp = emu::current->warps[emu::me / 32];
    const unsigned whole = warp.lanes == 32 ? emu::FULL_MASK : (1u << warp.lanes) - 1;
    emu::collective("__syncwarp", mask, site, [&] {
        if (mask == whole) ++warp.epoch;
    });
}

// CUDA's integer min/max are global device functions.
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace emu {
enum class ShuffleMode { index, up, down, xor_ };

// PTX shfl.sync: lanes in segments of `width`; the source lane j of lane l (index: the segment's lane b % width,
// up: l - b, down: l + b, xor: l ^ b) must lie in l's segment, except that xor may reach a lower one; otherwise l
// keeps its own value. A source outside mask gives an undefined value: NaN here.
inline float shuffle(ShuffleMode mode, const char* kind, unsigned mask, float value, int b, int width,
                     const Site& site) {
    Launch& launch = *current;
    if (width < 1 || width > 32 || !std::has_single_bit(static_cast<unsigned>(width)))
        fail(std::string(kind) + " at " + where(site) + ": width " + std::to_string(width) +
             " is not a power of 2 up to 32");
    launch.values[me] = value;
    const unsigned warp = me / 32;
    collective(kind, mask, site, [&] {
        for (unsigned l = 0; l < 32; ++l) {
            if (!(mask >> l & 1u)) continue;
            const int lane = static_cast<int>(l), first = lane & ~(width - 1), last = first + width - 1;
            int source = lane;
            switch (mode) {
                case ShuffleMode::index: source = first + (b & (width - 1)); break;
                case ShuffleMode::up: source = lane - b >= first ? lane - b : lane; break;
                case ShuffleMode::down: source = lane + b <= last ? lane + b : lane; break;
                case ShuffleMode::xor_: source = (lane ^ (b & 31)) <= last ? lane ^ (b & 31) : lane; break;
            }
            launch.shuffled[warp * 32 + l] =
                mask >> source & 1u ? launch.values[warp * 32 + source] : std::numeric_limits<float>::quiet_NaN();
        }
    });
    return launch.shuffled[me];
}
}  // namespace emu

inline float __shfl_sync(unsigned mask, float value, int lane, int width = 32,
                         const emu::Site& site = emu::Site::current()) {
    return emu::shuffle(emu::ShuffleMode::index, "__shfl_sync", mask, value, lane, width, site);
}
inline float __shfl_up_sync(unsigned mask, float value, unsigned delta, int width = 32,
                            const emu::Site& site = emu::Site::current()) {
    return emu::shuffle(emu::ShuffleMode::up, "__shfl_up_sync", mask, value, static_cast<int>(delta), width, site);
}
inline float __shfl_down_sync(unsigned mask, float value, unsigned delta, int width = 32,
                              const emu::Site& site = emu::Site::current()) {
    return emu::shuffle(emu::ShuffleMode::down, "__shfl_down_sync", mask, value, static_cast<int>(delta), width,
                        site);
}
inline float __shfl_xor_sync(unsigned mask, float value, int lane_mask, int width = 32,
                             const emu::Site& site = emu::Site::current()) {
    return emu::shuffle(emu::ShuffleMode::xor_, "__shfl_xor_sync", mask, value, lane_mask, width, site);
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

// fp8 as CUDA's cuda_fp8.h has it: explicit conversions from and to float (to fp8: round to nearest even,
// saturating: __NV_SATFINITE), bit for bit as ../host/fp8.h converts.
struct __nv_fp8_e4m3 {
    uint8_t __x;
    __nv_fp8_e4m3() = default;
    explicit __nv_fp8_e4m3(float f) : __x(fp8::from_float(f, fp8::E4M3)) {}
    explicit operator float() const { return fp8::to_float(__x, fp8::E4M3); }
};
struct __nv_fp8_e5m2 {
    uint8_t __x;
    __nv_fp8_e5m2() = default;
    explicit __nv_fp8_e5m2(float f) : __x(fp8::from_float(f, fp8::E5M2)) {}
    explicit operator float() const { return fp8::to_float(__x, fp8::E5M2); }
};

struct alignas(8) uint2 {
    unsigned x, y;
};
struct alignas(16) uint4 {
    unsigned x, y, z, w;
};
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }

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
inline void mma_16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                      const emu::Site& site = emu::Site::current()) {
    emu::Launch& launch = *emu::current;
    const unsigned me = emu::me, warp = me / 32;
    launch.words[me] = {a[0], a[1], a[2], a[3], b0, b1};
    launch.accumulators[me] = {d[0], d[1], d[2], d[3]};
    emu::collective("mma.sync.m16n8k16", emu::FULL_MASK, site, [&] {
        float A[16][16], B[16][8];
        for (unsigned l = 0; l < 32; ++l) {
            const auto& w = launch.words[warp * 32 + l];
            const int group = l / 4, thread = l % 4;
            for (int i = 0; i < 8; ++i)
                A[group + 8 * ((i / 2) % 2)][2 * thread + i % 2 + 8 * (i / 4)] = emu::half_of<T>(w[i / 2], i % 2);
            for (int i = 0; i < 4; ++i)
                B[2 * thread + i % 2 + 8 * (i / 2)][group] = emu::half_of<T>(w[4 + i / 2], i % 2);
        }
        for (unsigned l = 0; l < 32; ++l) {
            const int group = l / 4, thread = l % 4;
            for (int i = 0; i < 4; ++i) {
                const int row = group + 8 * (i / 2), column = 2 * thread + i % 2;
                float sum = 0.0f;
                for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][column];
                launch.accumulators[warp * 32 + l][i] += sum;
            }
        }
    });
    for (int i = 0; i < 4; ++i) d[i] = launch.accumulators[me][i];
}

// Four 8x8 matrices of 16-bit elements from shared memory, transposed: lanes 8m .. 8m + 7 give the addresses of
// matrix m's rows; lane l receives, of each matrix, the elements (row 2 (l % 4), column l / 4) and (row 2 (l % 4)
// + 1, column l / 4). A weak load: the rows must have landed and be ordered before it (check_visible).
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row, const emu::Site& site = emu::Site::current()) {
    emu::Launch& launch = *emu::current;
    const unsigned me = emu::me, warp = me / 32;
    launch.rows[me] = row;
    emu::collective("ldmatrix.x4.trans", emu::FULL_MASK, site, [&] {
        for (unsigned l = 0; l < 32; ++l) emu::check_visible(launch.rows[warp * 32 + l], site, l);
        for (unsigned l = 0; l < 32; ++l)
            for (int m = 0; m < 4; ++m) {
                const auto* first = static_cast<const uint16_t*>(launch.rows[warp * 32 + 8 * m + 2 * (l % 4)]);
                const auto* second = static_cast<const uint16_t*>(launch.rows[warp * 32 + 8 * m + 2 * (l % 4) + 1]);
                launch.loaded[warp * 32 + l][m] =
                    static_cast<uint32_t>(first[l / 4]) | static_cast<uint32_t>(second[l / 4]) << 16;
            }
    });
    for (int m = 0; m < 4; ++m) r[m] = launch.loaded[me][m];
}

// cp.async.cg 16 bytes global -> shared (zeros when !valid): read now, landed by this thread's wait_group.
inline void cp_async_16(void* shared, const void* global, bool valid, const emu::Site& site = emu::Site::current()) {
    emu::maybe_yield();
    emu::Launch& launch = *emu::current;
    std::unique_lock lock(launch.mutex);
    if (launch.aborted) throw emu::Abort{};
    const auto address = reinterpret_cast<uintptr_t>(shared);
    if (address % 16 || (valid && reinterpret_cast<uintptr_t>(global) % 16))
        emu::fail("cp.async at " + emu::where(site) + ": " + (address % 16 ? "shared" : "global") +
                  " address not 16-byte aligned");
    emu::Copy copy{static_cast<unsigned char*>(shared), {}, site};
    if (valid) std::memcpy(copy.data.data(), global, 16);
    emu::Landing& landing = launch.landings[address];
    if (landing.pending && landing.thread != emu::me)
        emu::fail("cp.async at " + emu::where(site) + " by " + emu::thread_name(emu::me) + " targets 16 bytes " +
                  emu::thread_name(landing.thread) + "'s cp.async at " + emu::where(landing.site) +
                  " has not landed");
    landing = {true, emu::me, emu::me / 32, 0, 0, site};
    launch.uncommitted[emu::me].push_back(copy);
}

inline void cp_async_commit() {
    emu::Launch& launch = *emu::current;
    std::lock_guard lock(launch.mutex);
    launch.committed[emu::me].push_back(std::move(launch.uncommitted[emu::me]));
    launch.uncommitted[emu::me].clear();
}

// cp.async.wait_group N: this thread's committed groups but the N most recent have landed.
template <int N>
inline void cp_async_wait() {
    emu::maybe_yield();
    emu::Launch& launch = *emu::current;
    std::lock_guard lock(launch.mutex);
    auto& groups = launch.committed[emu::me];
    const unsigned warp = emu::me / 32;
    while (groups.size() > static_cast<size_t>(N)) {
        for (const emu::Copy& copy : groups.front()) {
            std::memcpy(copy.target, copy.data.data(), 16);
            launch.landings[reinterpret_cast<uintptr_t>(copy.target)] = {
                false, emu::me, warp, launch.warps[warp].epoch, launch.block_generation, copy.site};
        }
        groups.pop_front();
    }
}
