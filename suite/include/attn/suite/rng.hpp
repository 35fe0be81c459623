// attn/suite/rng.hpp: the suite's small seeded RNG (SplitMix64), so a case's values follow from its seed exactly.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "attn/detail/splitmix64.hpp"

namespace attn::suite {

// SplitMix64 (Steele, Lea & Flood, OOPSLA 2014; attn/detail/splitmix64.hpp): 64-bit state, full period, passes
// BigCrush; the same stream on every platform, which keeps case files and perturbations reproducible from their seed.
class Rng {
public:
    explicit Rng(std::uint64_t seed) : state_(seed) {}
    std::uint64_t next() { return attn::detail::splitmix64_next(state_); }  // the library's stream (dropout, init)
    // Uniform in [0, 1) with 53 random bits.
    double uniform() { return attn::detail::unit_uniform(next()); }
    double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
    // Uniform integer in [0, n).
    std::uint64_t below(std::uint64_t n) { return n == 0 ? 0 : next() % n; }
    // Standard normal (Box-Muller; one value per call, the second is dropped for simplicity).
    double normal() {
        double u1 = uniform();
        while (u1 <= 0.0) u1 = uniform();
        const double u2 = uniform();
        return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    }

private:
    std::uint64_t state_;
};

}  // namespace attn::suite
