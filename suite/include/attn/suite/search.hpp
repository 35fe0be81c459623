// attn/suite/search.hpp: targeted search, hill-climbing on error / bound to find the inputs a random search misses.
#pragma once

#include <cstdint>
#include <string>

#include "attn/suite/case.hpp"
#include "attn/suite/registry.hpp"

namespace attn::suite {

struct SearchResult {
    SdpaCase worst;           // the input with the largest error / bound found
    double tightness = 0;     // its max error / bound (> 1 is a violation)
    std::string worst_summary;  // the metrics module's one-line summary of that comparison
    int evaluations = 0;
    double seconds = 0;
};

// From `restarts` starting cases (each the worst of 50 random cases of the suite's generator), repeatedly mutate
// the inputs (scale a q row or a k row, copy a key onto another to make ties, change one q or k element, scale a
// value with a sign flip, flip a mask bit) and keep a change when it raises max error / bound against the oracle.
// `steps` mutations per start.
SearchResult targeted_search(const Implementation& impl, Dtype dtype, int restarts, int steps, std::uint64_t seed);

}  // namespace attn::suite
