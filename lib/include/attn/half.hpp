// attn/half.hpp: the 16-bit storage types, attn::float16 (IEEE binary16) and attn::bfloat16 (bfloat16: float's
// exponent, 8 significant bits).
//
// They store; they do not compute. Every attn kernel computes in float32 (the compute type, attn::compute_t) and
// rounds to the storage type once, so the types carry only two conversions:
//   - to float (and so to double), implicitly, and exactly: every float16 and bfloat16 value is a float;
//   - from any arithmetic value, explicitly, rounded to nearest, ties to even, in one step from the value given (a
//     double is never rounded to float first, which would round twice). Overflow gives +-inf, NaN stays NaN (quiet,
//     with the sign and the top payload bits kept), subnormals are kept (gradual underflow), never flushed.
//
// Why attn's own types and not one of the candidates: on the toolchains attn supports, g++ 12 has _Float16 on
// x86-64 but clang 14 (the fuzz targets) rejects it ("_Float16 is not supported on this target"), g++ 12 has no
// __bf16 without AVX512-BF16, Highway 1.0.3's hwy::float16_t has no scalar conversion at all and its
// hwy::BF16FromF32 truncates (rounds toward zero), which is one of the low-precision bugs the suite looks for. Both
// types are one uint16_t (standard layout, the same bits as hwy::float16_t / hwy::bfloat16_t and as NumPy's <f2 and
// safetensors' F16 / BF16), so buffers can be handed to Highway and written to files as they are.
#pragma once

#include <bit>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace attn {

namespace detail {

// Rounds x to the binary format with E exponent bits and M stored significand bits (IEEE layout: sign, exponent
// biased by 2^(E-1) - 1, significand), to nearest, ties to even, and returns its 16 bits. One rounding from the
// double: exact for every double, since a double has at least M + 2 significand bits more than the target.
template <int E, int M>
constexpr std::uint16_t round_double_to_bits(double x) {
    static_assert(1 + E + M == 16);
    constexpr int bias = (1 << (E - 1)) - 1;
    constexpr std::uint32_t exp_all_ones = (1u << E) - 1;
    constexpr std::uint16_t inf_bits = static_cast<std::uint16_t>(exp_all_ones << M);
    const std::uint64_t bits = std::bit_cast<std::uint64_t>(x);
    const auto sign = static_cast<std::uint16_t>((bits >> 48) & 0x8000u);
    const std::uint64_t magnitude = bits & 0x7fff'ffff'ffff'ffffull;
    const int exponent = static_cast<int>(magnitude >> 52);  // biased by 1023
    const std::uint64_t significand = magnitude & 0x000f'ffff'ffff'ffffull;
    if (exponent == 0x7ff) {
        if (significand == 0) return sign | inf_bits;
        // NaN: quiet, with the payload's top bits.
        const auto payload = static_cast<std::uint16_t>(significand >> (52 - M));
        return static_cast<std::uint16_t>(sign | inf_bits | (1u << (M - 1)) | payload);
    }
    if (exponent == 0) return sign;  // zero or a double subnormal (below 2^-1022): far below half the smallest target
    const int e = exponent - 1023;   // unbiased
    // Round the significand with the implicit bit to `keep` bits (by a right shift of `shift`), to nearest even.
    const auto round_shift = [](std::uint64_t value, int shift) -> std::uint64_t {
        if (shift > 63) return 0;
        const std::uint64_t kept = value >> shift;
        const std::uint64_t rest = value & ((std::uint64_t{1} << shift) - 1);
        const std::uint64_t half = std::uint64_t{1} << (shift - 1);
        return kept + ((rest > half || (rest == half && (kept & 1))) ? 1 : 0);
    };
    const std::uint64_t full = significand | (std::uint64_t{1} << 52);
    if (e + bias >= static_cast<int>(exp_all_ones)) return sign | inf_bits;  // beyond every finite value's exponent
    if (e >= 1 - bias) {
        // Normal: exponent field e + bias, significand rounded to M bits; a carry moves into the exponent (and into
        // the infinity pattern past the largest finite value, which is what rounding to nearest gives).
        const std::uint64_t rounded = round_shift(full, 52 - M);  // in [2^M, 2^(M+1)]
        const std::uint64_t field = (static_cast<std::uint64_t>(e + bias) << M) + (rounded - (std::uint64_t{1} << M));
        return field >= inf_bits ? static_cast<std::uint16_t>(sign | inf_bits) : static_cast<std::uint16_t>(sign | field);
    }
    // Subnormal: units of 2^(1 - bias - M); the value is full * 2^(e - 52). A round up to 2^M is the smallest normal.
    const int shift = 52 + (1 - bias - M) - e;  // > 52 - M
    return static_cast<std::uint16_t>(sign | round_shift(full, shift));
}

// The float a 16-bit pattern of that format denotes (exact).
template <int E, int M>
constexpr float bits_to_float(std::uint16_t h) {
    constexpr int bias = (1 << (E - 1)) - 1;
    const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    const std::uint32_t exponent = (h >> M) & ((1u << E) - 1);
    const std::uint32_t significand = h & ((1u << M) - 1);
    if (exponent == (1u << E) - 1)  // inf or NaN: the payload moves to float's top significand bits
        return std::bit_cast<float>(sign | 0x7f80'0000u | (significand << (23 - M)));
    if (exponent == 0) {
        // Zero or subnormal: significand * 2^(1 - bias - M), exact in float (float's range covers both formats'
        // subnormals: 2^-24 for float16, 2^-133 for bfloat16).
        float magnitude = static_cast<float>(significand);
        for (int i = 0; i < bias - 1 + M; ++i) magnitude *= 0.5f;
        return sign ? -magnitude : magnitude;
    }
    return std::bit_cast<float>(sign | ((exponent - bias + 127) << 23) | (significand << (23 - M)));
}

}  // namespace detail

// IEEE 754 binary16: 5 exponent bits, 10 stored significand bits (11 significant), largest finite 65504, smallest
// normal 2^-14, smallest subnormal 2^-24, unit roundoff 2^-11.
struct float16 {
    std::uint16_t bits = 0;

    constexpr float16() = default;
    template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
    constexpr explicit float16(A x) : bits(detail::round_double_to_bits<5, 10>(static_cast<double>(x))) {}
    static constexpr float16 from_bits(std::uint16_t b) {
        float16 h;
        h.bits = b;
        return h;
    }
    constexpr operator float() const { return detail::bits_to_float<5, 10>(bits); }
};

// bfloat16: float32's 8 exponent bits, 7 stored significand bits (8 significant); the top half of a float. Largest
// finite about 3.39e38, smallest normal 2^-126, smallest subnormal 2^-133, unit roundoff 2^-8.
struct bfloat16 {
    std::uint16_t bits = 0;

    constexpr bfloat16() = default;
    template <class A, class = std::enable_if_t<std::is_arithmetic_v<A>>>
    constexpr explicit bfloat16(A x) : bits(detail::round_double_to_bits<8, 7>(static_cast<double>(x))) {}
    static constexpr bfloat16 from_bits(std::uint16_t b) {
        bfloat16 h;
        h.bits = b;
        return h;
    }
    constexpr operator float() const { return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16); }
};

static_assert(sizeof(float16) == 2 && std::is_standard_layout_v<float16> && std::is_trivially_copyable_v<float16>);
static_assert(sizeof(bfloat16) == 2 && std::is_standard_layout_v<bfloat16> && std::is_trivially_copyable_v<bfloat16>);

template <class T>
inline constexpr bool is_half_v = std::is_same_v<T, float16> || std::is_same_v<T, bfloat16>;

// The type a kernel computes in for storage type T: float for the 16-bit types, T itself otherwise.
template <class T>
using compute_t = std::conditional_t<is_half_v<T>, float, T>;

}  // namespace attn

// numeric_limits for the storage types, so generic code (unit roundoffs, ranges, NaN) reads them as for float.
template <>
struct std::numeric_limits<attn::float16> {
    static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false;
    static constexpr bool has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true;
    static constexpr bool is_iec559 = true, is_bounded = true, is_modulo = false;
    static constexpr std::float_denorm_style has_denorm = std::denorm_present;
    static constexpr std::float_round_style round_style = std::round_to_nearest;
    static constexpr int digits = 11, digits10 = 3, max_digits10 = 5, radix = 2;
    static constexpr int min_exponent = -13, min_exponent10 = -4, max_exponent = 16, max_exponent10 = 4;
    static constexpr attn::float16 min() { return attn::float16::from_bits(0x0400); }
    static constexpr attn::float16 max() { return attn::float16::from_bits(0x7bff); }
    static constexpr attn::float16 lowest() { return attn::float16::from_bits(0xfbff); }
    static constexpr attn::float16 epsilon() { return attn::float16::from_bits(0x1400); }      // 2^-10
    static constexpr attn::float16 round_error() { return attn::float16::from_bits(0x3800); }  // 0.5
    static constexpr attn::float16 infinity() { return attn::float16::from_bits(0x7c00); }
    static constexpr attn::float16 quiet_NaN() { return attn::float16::from_bits(0x7e00); }
    static constexpr attn::float16 signaling_NaN() { return attn::float16::from_bits(0x7d00); }
    static constexpr attn::float16 denorm_min() { return attn::float16::from_bits(0x0001); }
};

template <>
struct std::numeric_limits<attn::bfloat16> {
    static constexpr bool is_specialized = true, is_signed = true, is_integer = false, is_exact = false;
    static constexpr bool has_infinity = true, has_quiet_NaN = true, has_signaling_NaN = true;
    static constexpr bool is_iec559 = false, is_bounded = true, is_modulo = false;
    static constexpr std::float_denorm_style has_denorm = std::denorm_present;
    static constexpr std::float_round_style round_style = std::round_to_nearest;
    static constexpr int digits = 8, digits10 = 2, max_digits10 = 4, radix = 2;
    static constexpr int min_exponent = -125, min_exponent10 = -37, max_exponent = 128, max_exponent10 = 38;
    static constexpr attn::bfloat16 min() { return attn::bfloat16::from_bits(0x0080); }
    static constexpr attn::bfloat16 max() { return attn::bfloat16::from_bits(0x7f7f); }
    static constexpr attn::bfloat16 lowest() { return attn::bfloat16::from_bits(0xff7f); }
    static constexpr attn::bfloat16 epsilon() { return attn::bfloat16::from_bits(0x3c00); }      // 2^-7
    static constexpr attn::bfloat16 round_error() { return attn::bfloat16::from_bits(0x3f00); }  // 0.5
    static constexpr attn::bfloat16 infinity() { return attn::bfloat16::from_bits(0x7f80); }
    static constexpr attn::bfloat16 quiet_NaN() { return attn::bfloat16::from_bits(0x7fc0); }
    static constexpr attn::bfloat16 signaling_NaN() { return attn::bfloat16::from_bits(0x7fa0); }
    static constexpr attn::bfloat16 denorm_min() { return attn::bfloat16::from_bits(0x0001); }
};
