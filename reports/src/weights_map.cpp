// The weights heatmap (attn/report/weights_map.hpp): one gnuplot image, the blocked cells a colour band of their own.
#include "attn/report/weights_map.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "attn/detail/problem.hpp"
#include "attn/error.hpp"
#include "attn/suite/case.hpp"
#include "attn/suite/config.hpp"
#include "attn/suite/recipe.hpp"
#include "plots.hpp"

namespace attn::report {

namespace fs = std::filesystem;

template <class T>
WeightsMap weights_map(const std::string& function, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                       std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options,
                       TensorView<const T> weights, Index b, std::string title) {
    const SdpaProblem<T> p = make_sdpa_problem<T>(function, q, k, v, allowed_mask, options);
    if (weights.shape() != p.weights_shape())
        throw ShapeError(function + ": weights " + to_string(weights.shape()) + " are not (batch..., Tq, Tk) = " +
                         to_string(p.weights_shape()) + " (" + p.shapes + ")");
    if (b < 0 || b >= p.batch)
        throw ShapeError(function + ": batch element " + std::to_string(b) + " is outside the batch shape " +
                         to_string(p.batch_shape) + " (" + p.shapes + ")");
    WeightsMap m;
    m.Tq = p.Tq, m.Tk = p.Tk, m.positions = p.positions, m.title = std::move(title);
    // Element (b, i, j) of the weights through their strides: flat b in C order over the batch dims.
    Index offset = 0, rest = b;
    for (Index d = static_cast<Index>(p.batch_shape.size()); d-- > 0;) {
        offset += rest % p.batch_shape[static_cast<std::size_t>(d)] * weights.stride(d);
        rest /= p.batch_shape[static_cast<std::size_t>(d)];
    }
    m.weights.resize(static_cast<std::size_t>(p.Tq * p.Tk));
    m.blocked.resize(m.weights.size());
    for (Index i = 0; i < p.Tq; ++i)
        for (Index j = 0; j < p.Tk; ++j) {
            const std::size_t n = static_cast<std::size_t>(i * p.Tk + j);
            const Index at = offset + i * weights.stride(-2) + j * weights.stride(-1);
            m.weights[n] = static_cast<double>(weights.data()[at]);
            m.blocked[n] = !p.allowed(b, i, j);
        }
    return m;
}

#define ATTN_INSTANTIATE(T)                                                                                        \
    template WeightsMap weights_map<T>(const std::string&, TensorView<const T>, TensorView<const T>,              \
                                       TensorView<const T>, std::optional<TensorView<const bool>>,                \
                                       const SdpaOptions&, TensorView<const T>, Index, std::string);
ATTN_INSTANTIATE(float)
ATTN_INSTANTIATE(double)
ATTN_INSTANTIATE(float16)
ATTN_INSTANTIATE(bfloat16)
#undef ATTN_INSTANTIATE

namespace {

// `text` as the inside of a gnuplot double-quoted string: quotes and backslashes escaped, new lines kept as \n.
std::string gnuplot_text(const std::string& text) {
    std::string s;
    for (char ch : text) {
        if (ch == '\n') s += "\\n";
        else if (ch == '"' || ch == '\\') s += std::string("\\") + ch;
        else s += ch;
    }
    return s;
}

// The segment of the line x = y + c (key = query + c) inside the map's cells, as a gnuplot arrow without a head.
std::string diagonal(double c, Index Tq, Index Tk, const char* colour, const char* dash) {
    const double y0 = std::max(-0.5, -0.5 - c), y1 = std::min(Tq - 0.5, Tk - 0.5 - c);
    if (y1 <= y0) return "";
    std::ostringstream s;
    s << "set arrow from " << y0 + c << "," << y0 << " to " << y1 + c << "," << y1 << " nohead front lw 2 lc rgb '"
      << colour << "' dt " << dash << "\n";
    return s.str();
}

}  // namespace

std::string write_weights_map(const WeightsMap& map, const std::string& svg) {
    // Past this the cells are below a pixel and gnuplot's SVG grows to hundreds of megabytes.
    constexpr Index most = 2048;
    if (map.Tq > most || map.Tk > most)
        return "the map has " + std::to_string(map.Tq) + " x " + std::to_string(map.Tk) +
               " cells; it draws at most " + std::to_string(most) + " per side (plot a slice)";
    if (map.Tq == 0 || map.Tk == 0) return "the map has no cells (Tq = " + std::to_string(map.Tq) +
                                           ", Tk = " + std::to_string(map.Tk) + ")";
    const fs::path work = fs::temp_directory_path() / ("attn-weights-" + std::to_string(::getpid()));
    fs::create_directories(work);
    const fs::path data = work / "weights.dat", script = work / "weights.gp";
    {
        // log10 of each weight, clamped to [-9, 0] (-9 is "1e-9 or less", exact zeros included); blocked: -9.5,
        // the grey band below the colour scale.
        std::ofstream out(data);
        for (Index i = 0; i < map.Tq; ++i) {
            for (Index j = 0; j < map.Tk; ++j) {
                const std::size_t n = static_cast<std::size_t>(i * map.Tk + j);
                const double w = map.weights[n];
                const double z = map.blocked[n] ? -9.5 : std::isnan(w) ? -9.5 : std::clamp(std::log10(w), -9.0, 0.0);
                out << (j ? " " : "") << z;
            }
            out << "\n";
        }
    }
    const int width = 900, height = static_cast<int>(std::clamp<double>(900.0 * map.Tq / map.Tk, 250, 1400));
    std::ofstream gp(script);
    gp << "set terminal svg size " << width << "," << height
       << " font 'Helvetica,13' background rgb 'white' noenhanced\n"
       << "set output \"" << gnuplot_text(svg) << "\"\n"
       << "set title \"" << gnuplot_text(map.title.substr(0, map.title.find('\n'))) << "\"\n"
       << "set xlabel 'key j'\nset ylabel 'query i'\n"
       << "set xrange [-0.5:" << map.Tk - 0.5 << "]\nset yrange [" << map.Tq - 0.5 << ":-0.5]\n"
       << "set cbrange [-10:0]\n"
       << "set palette defined (-10 '#d9d9d9', -9.001 '#d9d9d9', -9 '#440154', -6.75 '#3b528b', -4.5 '#21918c', "
          "-2.25 '#5ec962', 0 '#fde725')\n"
       << "set cbtics ('blocked' -9.5, '<= 1e-9' -9, '1e-6' -6, '1e-3' -3, '1' 0)\n"
       << "set cblabel 'weight (log scale); grey: the query may not read the key'\n"
       << "unset key\n";
    if (map.title.find('\n') != std::string::npos)  // the rest of the title (a config string) small, below the plot
        gp << "set label \"" << gnuplot_text(map.title.substr(map.title.find('\n') + 1))
           << "\" at screen 0.5, screen 0.02 center font ',9'\nset bmargin 5\n";
    const PositionRule& r = map.positions;
    const double shift = static_cast<double>(map.Tk - map.Tq);
    if (r.is_causal)  // the last key a query may read: j = i (top-left) or i + Tk - Tq (bottom-right)
        gp << diagonal((r.alignment == CausalAlignment::BottomRight ? shift : 0) + 0.5, map.Tq, map.Tk, "#d62728", "1");
    if (r.window) {  // i + d - left <= j <= i + d + right
        const double d = r.window->alignment == CausalAlignment::BottomRight ? shift : 0;
        if (r.window->left >= 0)
            gp << diagonal(d - static_cast<double>(r.window->left) - 0.5, map.Tq, map.Tk, "#ff7f0e", "2");
        if (r.window->right >= 0)
            gp << diagonal(d + static_cast<double>(r.window->right) + 0.5, map.Tq, map.Tk, "#ff7f0e", "2");
    }
    // Small maps cell by cell (crisp edges in every viewer); large ones as one embedded image.
    gp << "plot \"" << gnuplot_text(data.string()) << "\" matrix with image"
       << (map.Tq * map.Tk <= 128 * 128 ? " pixels" : "") << " title 'weights'\n";
    gp.close();
    std::string problem;
    const bool drawn = run_gnuplot(script, problem);
    std::error_code ignored;
    fs::remove_all(work, ignored);
    return drawn ? "" : problem;
}

// One map per variant, from the suite's recipes (the config string names each case, so `attn properties --case`
// reruns it): batch element 0, weights from `reference` in double.
void plot_weights_maps(const std::string& plot_dir, Plots& result) {
    struct Variant {
        const char* file;
        const char* what;
        const char* fields;  // after the shape
    };
    const Variant variants[] = {
        {"causal_br", "causal, bottom-right (the KV-cache case)", "mask=causal-br"},
        {"causal_tl", "causal, top-left", "mask=causal-tl"},
        {"window", "sliding window (8, 0), bottom-right", "mask=window,window=8:0:br"},
        {"padding", "key padding (a prefix of the keys per batch element)", "mask=padding-r4"},
        {"alibi", "ALiBi, standard slopes, with the causal rule", "mask=causal-br,alibi=heads"},
        {"bias", "an additive bias of N(0, 4)", "mask=none,bias=normal"},
        {"softcap", "soft-cap 2 on logits of standard deviation 8", "mask=none,softcap=2"},
    };
    for (const Variant& v : variants) {
        const std::string values =
            std::string(v.file) == "softcap" ? "values=large-logits,logit_std=8" : "values=normal";
        const std::string config = std::string("sdpa(B=2,H=2,Tq=24,Tk=40,Dk=16,Dv=16,") + v.fields +
                                   ",dtype=double," + values + ",seed=0x1,empty_rows=zero,impl=reference)";
        try {
            const suite::SdpaCase c = suite::make_case(suite::parse_config(config));
            const suite::CaseInputs<double> in = suite::make_inputs<double>(c);
            SdpaOptions options = in.with_bias(c.options);
            options.backend = Backend::Reference;
            options.return_weights = true;
            const SdpaResult<double> r =
                scaled_dot_product_attention(in.q_view, in.k_view, in.v_view, in.allowed_view, options);
            const WeightsMap map =
                weights_map<double>("report", in.q_view, in.k_view, in.v_view, in.allowed_view, options,
                                    r.weights->view(), 0, std::string(v.what) + "\n" + config);
            const std::string name = "weights_" + std::string(v.file) + ".svg";
            const std::string path = "plots/" + name;
            const std::string problem = write_weights_map(map, (fs::path(plot_dir) / name).string());
            if (problem.empty()) result.plots.push_back({path, std::string("weights map: ") + v.what, ""});
            else result.problems.push_back(problem);
        } catch (const std::exception& e) {
            result.problems.push_back(std::string("weights map ") + v.file + ": " + e.what());
        }
    }
}

}  // namespace attn::report
