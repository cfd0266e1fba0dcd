// fp8 e4m3 (OCP "fn": no infinities, S.1111.111 is NaN, largest finite 448) and e5m2 (IEEE-like: infinities and
// NaNs at exponent 31, largest finite 57344) on the host, bit for bit as CUDA's cuda_fp8.h converts them:
// float -> fp8 rounds to nearest even and, as __NV_SATFINITE, saturates every finite or infinite |x| beyond the
// largest finite value to it; NaN stays NaN. fp8 -> float is exact. Shared by the CPU attention
// (paged_attention_cpu.cpp) and the kernels' emulation (../emulation/cuda_emu.h).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace fp8 {

struct Format {
    int mantissa_bits;
    int bias;
    float max_finite;
    bool ieee_specials;  // e5m2: exponent 31 holds inf and NaN; e4m3: only S.1111.111 is NaN
};
inline constexpr Format E4M3{3, 7, 448.0f, false};
inline constexpr Format E5M2{2, 15, 57344.0f, true};

inline float to_float(uint8_t bits, const Format& f) {
    const int exponent_field = (bits & 0x7f) >> f.mantissa_bits;
    const int mantissa = bits & ((1 << f.mantissa_bits) - 1);
    const float sign = bits & 0x80 ? -1.0f : 1.0f;
    const int max_field = (1 << (7 - f.mantissa_bits)) - 1;
    if (f.ieee_specials && exponent_field == max_field) return mantissa ? NAN : sign * INFINITY;
    if (!f.ieee_specials && (bits & 0x7f) == 0x7f) return NAN;
    if (exponent_field == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
    return sign * std::ldexp(static_cast<float>(mantissa + (1 << f.mantissa_bits)),
                             exponent_field - f.bias - f.mantissa_bits);
}

inline uint8_t from_float(float x, const Format& f) {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
    if (std::isnan(x)) return sign | 0x7f;  // a NaN in both formats
    const double magnitude = std::fabs(static_cast<double>(x));
    const int min_exponent = 1 - f.bias;  // of the normal numbers; the subnormals share its quantum
    int exponent = magnitude > 0 ? std::ilogb(magnitude) : min_exponent;
    if (exponent < min_exponent) exponent = min_exponent;
    // The quantum at x's binade; x / quantum is exact (a power of two) and nearbyint rounds it half to even.
    const double quantum = std::ldexp(1.0, exponent - f.mantissa_bits);
    double rounded = std::nearbyint(magnitude / quantum) * quantum;
    if (!(rounded <= f.max_finite)) rounded = f.max_finite;  // saturate (infinity included)
    if (rounded == 0) return sign;
    int e = std::ilogb(rounded);  // rounding may have carried into the next binade
    if (e < min_exponent) {  // subnormal: the mantissa field is the count of quanta
        return sign | static_cast<uint8_t>(std::ldexp(rounded, f.bias - 1 + f.mantissa_bits));
    }
    const int mantissa = static_cast<int>(std::ldexp(rounded, f.mantissa_bits - e)) - (1 << f.mantissa_bits);
    return sign | static_cast<uint8_t>(((e + f.bias) << f.mantissa_bits) | mantissa);
}

}  // namespace fp8
