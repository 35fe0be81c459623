// attn/detail/splitmix64.hpp: internal, no stability promise. The one SplitMix64 of the project: the library's
// dropout and parameter initialisation draw from it, and so does the test suite's Rng (attn/suite/rng.hpp).
#pragma once

#include <cstdint>

namespace attn::detail {

// SplitMix64 (Steele, Lea & Flood, OOPSLA 2014). The finaliser is a bijection with good avalanche, so hashing a
// counter gives independent-looking draws that do not depend on evaluation order or thread count; stepping the
// state by the golden gamma gives a full-period stream, the same on every platform.
constexpr std::uint64_t splitmix64_mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// The next draw of the stream whose state is `state` (advanced in place).
constexpr std::uint64_t splitmix64_next(std::uint64_t& state) { return splitmix64_mix(state += 0x9e3779b97f4a7c15ULL); }

// Uniform in [0, 1) from the top 53 bits of a draw.
constexpr double unit_uniform(std::uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

}  // namespace attn::detail
