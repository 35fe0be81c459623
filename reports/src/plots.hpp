// reports/src/plots.hpp: the report's plots, drawn by gnuplot (SVG terminal) from the rows.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "attn/report/accuracy.hpp"

namespace attn::report {

struct Plot {
    std::string path;  // relative to the report directory: plots/<name>.svg
    std::string alt;   // one line saying what it shows
    std::string impl;  // empty for plots over every implementation
};

struct Plots {
    std::vector<Plot> plots;
    std::vector<std::string> problems;  // why a plot could not be made (gnuplot missing, failed, ...)
};

// Writes report_dir/plots/*.svg: per implementation error vs Tk, vs Dk and vs logit scale (max and p99 ULP error,
// and max tightness, float and double), and one histogram of the rows' max tightness.
Plots make_plots(const std::vector<Row>& rows, const std::string& report_dir);

// Writes report_dir/plots/weights_<variant>.svg: the weights map (attn/report/weights_map.hpp) of one small case per
// mask and variant (causal in both alignments, a window, key padding, ALiBi, a bias, a soft-cap).
void plot_weights_maps(const std::string& plot_dir, Plots& result);

// Runs gnuplot on `script`; false with gnuplot's output in `problem` when it failed (or is not installed).
bool run_gnuplot(const std::filesystem::path& script, std::string& problem);

}  // namespace attn::report
