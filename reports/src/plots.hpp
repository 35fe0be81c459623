// reports/src/plots.hpp: the report's plots, drawn by gnuplot (SVG terminal) from the rows.
#pragma once

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

}  // namespace attn::report
