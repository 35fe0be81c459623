// attn/report/weights_map.hpp: the attention weights of one (batch, head) as a heatmap (SVG drawn by gnuplot), with
// the cells a query may not read marked apart from cells whose weight is merely small (`attn sdpa --plot-weights`,
// and the report's map per variant).
#pragma once

#include <string>
#include <vector>

#include "attn/sdpa.hpp"

namespace attn::report {

struct WeightsMap {
    Index Tq = 0, Tk = 0;
    std::vector<double> weights;  // (Tq, Tk), row-major
    std::vector<char> blocked;    // (Tq, Tk): the query may not read the key (the rule, the mask, a -inf bias)
    PositionRule positions;       // its causal diagonal and window edges are drawn as lines
    std::string title;            // its first line above the map, the rest in small type below it
};

// The map of batch element b of a call (flat index over the broadcast batch shape): weights (batch..., Tq, Tk) as
// the library returned them, the blocked cells from the call's contract (SdpaProblem::allowed). ShapeError naming
// `function` when the weights are not (batch..., Tq, Tk).
template <class T>
WeightsMap weights_map(const std::string& function, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                       std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                       TensorView<const T> weights, Index b, std::string title);

// Writes the map to `svg`: weights on a log colour scale from 1e-8 to 1 (smaller ones, exact zeros included, at its
// foot), blocked cells hatched grey, the causal diagonal and the window's edges as lines. Returns an empty string,
// or why the plot could not be drawn (gnuplot missing or failing).
std::string write_weights_map(const WeightsMap& map, const std::string& svg);

}  // namespace attn::report
