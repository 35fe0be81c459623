// The report's plots: data files and gnuplot scripts in a temporary directory, SVGs in report_dir/plots.
#include "plots.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

namespace attn::report {

namespace fs = std::filesystem;

namespace {

std::string quoted(const std::string& s) { return "'" + s + "'"; }

std::string fmt_g(double x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", x);
    return buf;
}

// Log axes cannot show 0, and exact rows (0 ulps, tightness 0) are common and worth seeing: zeros are drawn one
// decade below the smallest positive value, at a tick labelled "0". Returns that position, and writes explicit
// decade ticks from there up to `top`.
struct LogAxis {
    double zero_at = 0.1;
    std::string tics;  // gnuplot "set ytics (...)" argument
};

LogAxis log_axis(const std::vector<double>& values, double top) {
    double lo = top, hi = top;
    bool zero = false;
    for (double v : values) {
        if (v > 0 && std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
        zero |= v == 0;
    }
    LogAxis axis;
    const int first = static_cast<int>(std::floor(std::log10(lo))) - 1;
    const int last = static_cast<int>(std::ceil(std::log10(hi)));
    axis.zero_at = std::pow(10.0, zero ? first : first + 1);  // without zeros the axis starts at the first decade
    const int step = std::max(1, (last - first) / 8);
    std::ostringstream t;
    t << "(";
    if (zero) t << "'0' " << fmt_g(axis.zero_at) << ", ";  // the "0" tick only when some value sits there
    for (int e = first + step; e <= last; e += step)
        t << (e == first + step ? "" : ", ") << "'" << fmt_g(std::pow(10.0, e)) << "' 1e" << e;
    t << ")";
    axis.tics = t.str();
    return axis;
}

double shown(double v, const LogAxis& axis) { return v > 0 ? v : axis.zero_at; }

struct Sweep {
    const char* name;       // Case::sweep
    const char* file;       // plots/<file>_<impl>.svg
    const char* xlabel;
    const char* what;       // for titles and alt text
    double (*x)(const Case&);
};

const Sweep sweeps[] = {
    {"tk", "error_vs_tk", "Tk (number of keys)", "error vs Tk", [](const Case& c) { return double(c.Tk); }},
    {"dk", "error_vs_dk", "Dk (query/key head dimension)", "error vs Dk", [](const Case& c) { return double(c.Dk); }},
    {"logit-scale", "error_vs_logit_scale", "standard deviation of the logits", "error vs logit scale",
     [](const Case& c) { return c.logit_std; }},
};

// "Tq=3, Dk=64, Dv=32, dist=normal, mask=none": what a sweep holds fixed, from its first row.
std::string fixed_fields(const Sweep& sweep, const Case& c) {
    std::ostringstream s;
    s << "B=" << c.B << ", H=" << c.H << ", Tq=" << c.Tq;
    if (std::string(sweep.name) != "tk") s << ", Tk=" << c.Tk;
    if (std::string(sweep.name) != "dk") s << ", Dk=" << c.Dk;
    s << ", Dv=" << c.Dv << ", mask=" << to_string(c.mask_kind) << ", dist=" << to_string(c.distribution);
    return s.str();
}


const char* colour(Dtype dtype) {
    switch (dtype) {
        case Dtype::Float: return "#1f77b4";     // blue
        case Dtype::Double: return "#d62728";    // red
        case Dtype::Float16: return "#2ca02c";   // green
        case Dtype::BFloat16: return "#ff7f0e";  // orange
    }
    return "#000000";
}

// Unit roundoff u of the dtype: 2^-24 for float, 2^-53 for double, 2^-11 for float16, 2^-8 for bfloat16 (the 16-bit
// types' results are rounded to them, which dominates their error).
double unit_roundoff(Dtype dtype) {
    switch (dtype) {
        case Dtype::Float: return 0x1.0p-24;
        case Dtype::Double: return 0x1.0p-53;
        case Dtype::Float16: return 0x1.0p-11;
        case Dtype::BFloat16: return 0x1.0p-8;
    }
    return 0x1.0p-53;
}

// One implementation's rows of one sweep as a three-panel plot (ulps, relative error, tightness); nothing when it
// has no rows there.
void plot_sweep(const std::vector<Row>& rows, const std::string& impl, const Sweep& sweep, const fs::path& work,
                const fs::path& plot_dir, Plots& result) {
    const std::string terminal = "set terminal svg size 1500,500 font 'Helvetica,13' background rgb 'white' noenhanced\n";
    std::map<Dtype, std::vector<const Row*>> series;
    const Row* first = nullptr;
    for (const Row& row : rows) {
        if (row.impl != impl || row.grid_case.sweep != sweep.name || !row.error.empty()) continue;
        series[row.dtype].push_back(&row);
        if (!first) first = &row;
    }
    if (!first) return;
    std::vector<double> ulps, rels, tightness;
    for (auto& [dtype, list] : series) {
        std::sort(list.begin(), list.end(),
                  [&](const Row* a, const Row* b) { return sweep.x(a->grid_case) < sweep.x(b->grid_case); });
        for (const Row* r : list) {
            ulps.push_back(r->max_ulp);
            ulps.push_back(r->p99_ulp);
            rels.push_back(r->max_rel / unit_roundoff(dtype));
            tightness.push_back(r->max_tightness);
        }
    }
    const LogAxis ulp_axis = log_axis(ulps, 1);
    const LogAxis rel_axis = log_axis(rels, 1);
    const LogAxis tight_axis = log_axis(tightness, 1);
    const std::string base = std::string(sweep.file) + "_" + impl;
    std::ostringstream ulp_plot, rel_plot, tight_plot;
    for (auto& [dtype, list] : series) {
        const fs::path data = work / (base + "_" + to_string(dtype) + ".dat");
        std::ofstream out(data);
        out << "# x max_ulp p99_ulp max_rel/u max_tightness\n";
        for (const Row* r : list)
            out << sweep.x(r->grid_case) << " " << shown(r->max_ulp, ulp_axis) << " "
                << shown(r->p99_ulp, ulp_axis) << " " << shown(r->max_rel / unit_roundoff(dtype), rel_axis)
                << " " << shown(r->max_tightness, tight_axis) << "\n";
        const std::string d = quoted(data.string()), c = colour(dtype), n = to_string(dtype);
        const std::string sep = ulp_plot.tellp() > 0 ? ", " : "";
        ulp_plot << sep << d << " using 1:2 with linespoints lw 2 pt 7 lc rgb '" << c << "' title '" << n
                 << " max', " << d << " using 1:3 with linespoints lw 1.5 dt 2 pt 6 lc rgb '" << c
                 << "' title '" << n << " p99'";
        rel_plot << sep << d << " using 1:4 with linespoints lw 2 pt 7 lc rgb '" << c << "' title '" << n << "'";
        tight_plot << sep << d << " using 1:5 with linespoints lw 2 pt 7 lc rgb '" << c << "' title '" << n << "'";
    }
    const fs::path svg = plot_dir / (base + ".svg");
    const fs::path script = work / (base + ".gp");
    std::ofstream gp(script);
    const auto panel = [&](const char* title, const char* ylabel, const LogAxis& axis) {
        gp << "set title '" << title << "'\nset ylabel '" << ylabel << "'\n"
           << "set yrange [" << fmt_g(axis.zero_at / 2) << ":*]\nset ytics " << axis.tics << "\n";
    };
    gp << terminal << "set output " << quoted(svg.string()) << "\n"
       << "set multiplot layout 1,3 title "
       << quoted(impl + ": " + sweep.what + " (" + fixed_fields(sweep, first->grid_case) + ")") << "\n"
       << "set logscale x 2\nset logscale y 10\nset grid\nset key below horizontal height 1\n"
       << "set xlabel " << quoted(sweep.xlabel) << "\n";
    panel("error in ulps (max, 99th percentile)", "ulps of the dtype", ulp_axis);
    gp << "plot " << ulp_plot.str() << "\n";
    panel("max relative error / u", "relative error in units of u", rel_axis);
    gp << "plot " << rel_plot.str() << "\n";
    panel("max error / bound (tightness)", "tightness (> 1 is a violation)", tight_axis);
    gp << "plot " << tight_plot.str() << ", 1 with lines dt 3 lw 2 lc rgb 'black' title 'bound'\n"
       << "unset multiplot\n";
    gp.close();
    std::string problem;
    if (run_gnuplot(script, problem))
        result.plots.push_back({"plots/" + base + ".svg", impl + ": " + sweep.what, impl});
    else
        result.problems.push_back(problem);
}

// Histogram of the rows' max tightness, one decade per bin, one bar per implementation x dtype.
void plot_tightness_histogram(const std::vector<Row>& rows, const fs::path& work, const fs::path& plot_dir,
                              Plots& result) {
    std::vector<std::string> series_names;
    std::map<std::string, std::map<int, Index>> counts;  // series -> decade (INT_MIN: exact, 1: violation) -> rows
    int lowest = 0;
    for (const Row& row : rows) {
        if (!row.error.empty()) continue;
        const std::string name = row.impl + " " + to_string(row.dtype);
        if (std::find(series_names.begin(), series_names.end(), name) == series_names.end()) series_names.push_back(name);
        int decade;
        if (row.max_tightness <= 0) decade = -1000;
        else if (row.max_tightness > 1) decade = 1;
        else decade = std::min(0, static_cast<int>(std::floor(std::log10(row.max_tightness)))) ;
        if (decade == 0) decade = -1;  // tightness exactly 1 joins [0.1, 1]
        if (decade > -1000 && decade < 1) lowest = std::min(lowest, decade);
        ++counts[name][decade];
    }
    if (!series_names.empty()) {
        const fs::path data = work / "tightness_histogram.dat";
        std::ofstream out(data);
        out << "\"bin\"";
        for (const auto& n : series_names) out << " \"" << n << "\"";
        out << "\n";
        const auto line = [&](const std::string& label, int decade) {
            out << "\"" << label << "\"";
            for (const auto& n : series_names) out << " " << counts[n][decade];
            out << "\n";
        };
        line("0 (exact)", -1000);  // no error at all
        for (int d = std::min(lowest, -1); d <= -1; ++d)
            line("1e" + std::to_string(d), d);
        line("> 1 (violates)", 1);
        out.close();
        Index tallest = 1;
        for (const auto& [name, bins] : counts)
            for (const auto& [decade, n] : bins) tallest = std::max(tallest, n);
        const fs::path svg = plot_dir / "tightness_histogram.svg";
        const fs::path script = work / "tightness_histogram.gp";
        std::ofstream gp(script);
        gp << "set terminal svg size 1100,480 font 'Helvetica,13' background rgb 'white' noenhanced\n"
           << "set output " << quoted(svg.string()) << "\n"
           << "set title 'Rows by max error / bound (tightness): healthy rows sit in 0.01..1, far left means a loose bound'\n"
           << "set style data histograms\nset style histogram clustered gap 1\nset style fill solid 0.85 border -1\n"
           << "set boxwidth 0.9\nset xtics rotate by -45\nset grid ytics\nset key top left box opaque\nset rmargin 8\n"
           << "set xlabel 'max error / bound of the row (bin 1e-3 holds 1e-3 <= tightness < 1e-2)'\n"
           << "set ylabel 'rows'\nset yrange [0:" << fmt_g(1.15 * static_cast<double>(tallest) + 0.5) << "]\n"
           << "plot " << quoted(data.string()) << " using 2:xtic(1) title columnheader(2)";
        if (series_names.size() > 1) gp << ", for [i=3:" << series_names.size() + 1 << "] '' using i title columnheader(i)";
        gp << "\n";
        gp.close();
        std::string problem;
        if (run_gnuplot(script, problem))
            result.plots.push_back({"plots/tightness_histogram.svg", "rows by max tightness, per implementation and dtype", ""});
        else
            result.problems.push_back(problem);
    }
}

}  // namespace

bool run_gnuplot(const fs::path& script, std::string& problem) {
    const fs::path log = fs::path(script).replace_extension(".log");
    const std::string command = "gnuplot " + quoted(script.string()) + " > " + quoted(log.string()) + " 2>&1";
    const int status = std::system(command.c_str());
    if (status == 0) return true;
    std::ifstream in(log);
    std::ostringstream text;
    text << in.rdbuf();
    problem = "gnuplot failed on " + script.filename().string() + ": " + text.str();
    return false;
}

Plots make_plots(const std::vector<Row>& rows, const std::string& report_dir) {
    Plots result;
    if (std::system("command -v gnuplot > /dev/null 2>&1") != 0) {
        result.problems.push_back("gnuplot is not installed (Debian package gnuplot-nox); no plots were drawn");
        return result;
    }
    const fs::path plot_dir = fs::path(report_dir) / "plots";
    fs::create_directories(plot_dir);
    const fs::path work = fs::temp_directory_path() / ("attn-report-" + std::to_string(::getpid()));
    fs::create_directories(work);

    std::vector<std::string> impls;
    for (const Row& row : rows)
        if (std::find(impls.begin(), impls.end(), row.impl) == impls.end()) impls.push_back(row.impl);
    for (const std::string& impl : impls)
        for (const Sweep& sweep : sweeps) plot_sweep(rows, impl, sweep, work, plot_dir, result);
    plot_tightness_histogram(rows, work, plot_dir, result);
    plot_weights_maps(plot_dir.string(), result);

    std::error_code ignored;
    fs::remove_all(work, ignored);
    return result;
}

}  // namespace attn::report
