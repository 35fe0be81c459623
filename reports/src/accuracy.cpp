// Measuring one implementation on one case against the oracle, the summaries, and the rows' JSON form.
#include "attn/report/accuracy.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "attn/error.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#include "attn/suite/recipe.hpp"

namespace attn::report {

namespace {

// The q-quantile (0 <= q <= 1) of values, nearest rank; 0 for none.
double quantile(std::vector<double> values, double q) {
    if (values.empty()) return 0;
    const auto n = values.size();
    auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(n)));
    rank = std::clamp<std::size_t>(rank, 1, n) - 1;
    std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(rank), values.end());
    return values[rank];
}

// Distance from |x| to the next T up, as a double.
template <class T>
double ulp_at(double x) {
    const T a = static_cast<T>(std::fabs(x));
    if (!std::isfinite(a)) return std::numeric_limits<double>::infinity();
    return static_cast<double>(std::nextafter(a, std::numeric_limits<T>::infinity())) - static_cast<double>(a);
}

}  // namespace

void fill_comparison(Row& row, const oracle::Comparison& cmp, Dtype dtype) {
    row.elements = cmp.elements;
    row.max_ulp = cmp.max_ulp;
    row.max_abs = cmp.max_abs;
    row.max_rel = cmp.max_rel;
    row.normwise_rel = cmp.normwise_rel;
    row.max_tightness = cmp.max_tightness;
    row.violations = cmp.violations;
    row.unbounded = cmp.unbounded;
    row.worst_index = cmp.worst_index;
    row.worst_computed = cmp.worst_computed;
    row.worst_exact = cmp.worst_exact;
    row.worst_bound = cmp.worst_bound;
    const double ulp = dtype == Dtype::Float     ? ulp_at<float>(cmp.worst_exact)
                       : dtype == Dtype::Double  ? ulp_at<double>(cmp.worst_exact)
                       : dtype == Dtype::Float16 ? ulp_at<float16>(cmp.worst_exact)
                                                 : ulp_at<bfloat16>(cmp.worst_exact);
    row.tightness_per_ulp = cmp.worst_bound > 0 ? ulp / cmp.worst_bound : 0;
}

namespace {

const char* const gradient_prefixes[] = {"dq ", "dk ", "dv "};

}  // namespace

std::string gradient_row_config(const std::string& gradient, const std::string& config) {
    return gradient + " " + config;
}

namespace {

template <class T>
void fill_metrics(Row& row, const Tensor<T>& output, const oracle::Result<T>& exact) {
    const oracle::Comparison cmp = oracle::compare_output<T>(output.view(), exact);
    fill_comparison(row, cmp, suite::dtype_of<T>());

    // The distribution over elements (the Comparison keeps only maxima): ulps for the p99, error / bound for
    // the median. Zero error over a zero bound is a tightness of 0, as in the Comparison.
    std::vector<double> ulps, tightness;
    ulps.reserve(static_cast<std::size_t>(output.numel()));
    tightness.reserve(static_cast<std::size_t>(output.numel()));
    for (Index i = 0; i < output.numel(); ++i) {
        const long double e = exact.output_exact[i];
        ulps.push_back(oracle::ulp_distance<T>(output[i], e));
        const double err =
            static_cast<double>(std::fabs((static_cast<long double>(output[i]) - e) - exact.output_exact_lo[i]));
        const double bound = exact.output_bound[i];
        tightness.push_back(err == 0 ? 0 : bound > 0 ? err / bound : std::numeric_limits<double>::infinity());
    }
    row.p99_ulp = quantile(std::move(ulps), 0.99);
    row.median_tightness = quantile(std::move(tightness), 0.5);
    if (exact.statistical) {
        const oracle::Comparison stat = oracle::compare_output_statistical<T>(output.view(), exact);
        const oracle::RowStatistic rs = oracle::row_statistic<T>(output.view(), exact);
        row.stat_max_tightness = stat.max_tightness;
        row.row_statistic = rs.threshold > 0 ? rs.sum_squares / rs.threshold : 0;
        row.suspicious = !stat.pass() || rs.suspicious();
    }
}

bool same_model(const oracle::ErrorModel& a, const oracle::ErrorModel& b) {
    return a.name == b.name && a.exp_ulps == b.exp_ulps && a.rescalings == b.rescalings &&
           a.scale_folded_into_q == b.scale_folded_into_q && a.key_block == b.key_block &&
           a.scale_roundings == b.scale_roundings;
}

template <class T>
std::vector<Row> measure_t(const std::vector<const suite::Implementation*>& impls, const Case& c, Dtype dtype) {
    std::vector<Row> rows;
    for (const suite::Implementation* impl : impls) {
        Row row;
        row.config = config_string(c, impl->name, dtype);
        row.impl = impl->name;
        row.dtype = dtype;
        row.grid_case = c;
        rows.push_back(std::move(row));
    }
    suite::CaseInputs<T> in;
    SdpaOptions options;
    try {
        const suite::SdpaCase sdpa_case = suite::make_case(row_config(c, "*", dtype));
        in = suite::make_inputs<T>(sdpa_case);
        options = in.with_bias(sdpa_case.options);
    } catch (const std::exception& e) {
        for (Row& row : rows) row.error = std::string("inputs: ") + e.what();
        return rows;
    }
    // The bound depends on the error model, the exact values do not; implementations sharing a model share the
    // oracle call (the expensive part of a row).
    std::vector<std::pair<oracle::ErrorModel, std::optional<oracle::Result<T>>>> oracles;
    for (std::size_t n = 0; n < impls.size(); ++n) {
        const suite::Implementation& impl = *impls[n];
        Row& row = rows[n];
        try {
            const oracle::Result<T>* exact = nullptr;
            for (auto& [model, result] : oracles)
                if (same_model(model, impl.error_model) && result) exact = &*result;
            if (!exact) {
                oracle::OracleOptions oracle_options;
                oracle_options.model = impl.error_model;
                oracle_options.statistical = true;
                oracles.emplace_back(impl.error_model,
                                     oracle::scaled_dot_product_attention<T>(in.q_view, in.k_view, in.v_view,
                                                                             in.allowed_view, options, oracle_options));
                exact = &*oracles.back().second;
            }
            const SdpaResult<T> got = impl.run<T>(in.q_view, in.k_view, in.v_view, in.allowed_view, options);
            fill_metrics(row, got.output, *exact);
        } catch (const suite::Unsupported& e) {
            row.skipped = e.what();
        } catch (const std::exception& e) {
            row.error = e.what();
        }
    }
    return rows;
}

template <class E>
E enum_from_string(const std::string& s, std::initializer_list<E> all, const char* field) {
    for (E e : all)
        if (s == to_string(e)) return e;
    throw IoError(std::string("report: accuracy.json: unknown ") + field + " '" + s + "'");
}

}  // namespace

std::vector<Row> measure(const std::vector<const suite::Implementation*>& impls, const Case& grid_case, Dtype dtype) {
    switch (dtype) {
        case Dtype::Float: return measure_t<float>(impls, grid_case, dtype);
        case Dtype::Float16: return measure_t<float16>(impls, grid_case, dtype);
        case Dtype::BFloat16: return measure_t<bfloat16>(impls, grid_case, dtype);
        case Dtype::Double: break;
    }
    return measure_t<double>(impls, grid_case, dtype);
}

std::vector<Summary> summarize(const std::vector<Row>& rows) {
    std::vector<Summary> out;
    std::map<std::pair<std::string, Dtype>, std::vector<double>> tightness;
    for (const Row& row : rows) {
        auto it = std::find_if(out.begin(), out.end(),
                               [&](const Summary& s) { return s.impl == row.impl && s.dtype == row.dtype; });
        if (it == out.end()) {
            Summary fresh;
            fresh.impl = row.impl;
            fresh.dtype = row.dtype;
            out.push_back(std::move(fresh));
            it = out.end() - 1;
        }
        Summary& s = *it;
        ++s.rows;
        if (row.failed()) ++s.failed_rows;
        s.violations += row.violations;
        s.unbounded += row.unbounded;
        s.suspicious_rows += row.suspicious;
        s.max_stat_tightness = std::max(s.max_stat_tightness, row.stat_max_tightness);
        s.max_row_statistic = std::max(s.max_row_statistic, row.row_statistic);
        s.max_ulp = std::max(s.max_ulp, row.max_ulp);
        s.max_p99_ulp = std::max(s.max_p99_ulp, row.p99_ulp);
        s.max_rel = std::max(s.max_rel, row.max_rel);
        if (row.error.empty() && (s.worst_config.empty() || row.max_tightness > s.max_tightness)) {
            s.max_tightness = row.max_tightness;
            s.worst_config = row.config;
        }
        if (row.error.empty()) tightness[{row.impl, row.dtype}].push_back(row.max_tightness);
    }
    for (Summary& s : out) s.median_tightness = quantile(tightness[{s.impl, s.dtype}], 0.5);
    return out;
}

nlohmann::json number(double x) {
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
    return x;
}

double number_from_json(const nlohmann::json& j) {
    if (j.is_number()) return j.get<double>();
    if (j.is_string()) {
        const auto s = j.get<std::string>();
        if (s == "inf") return std::numeric_limits<double>::infinity();
        if (s == "-inf") return -std::numeric_limits<double>::infinity();
        if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    }
    throw IoError("report: accuracy.json: expected a number or \"inf\"/\"-inf\"/\"nan\", got " + j.dump());
}

nlohmann::json to_json(const Row& row) {
    // The row's case, implementation and dtype are its config string's (row_from_json reads them back from it): only
    // the sweep, which the string does not name, is kept beside it.
    nlohmann::json j = {{"config", row.config}, {"sweep", row.grid_case.sweep}};
    j["error"] = row.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.error);
    j["elements"] = row.elements;
    j["max_ulp"] = number(row.max_ulp);
    j["p99_ulp"] = number(row.p99_ulp);
    j["max_abs"] = number(row.max_abs);
    j["max_rel"] = number(row.max_rel);
    j["normwise_rel"] = number(row.normwise_rel);
    j["max_tightness"] = number(row.max_tightness);
    j["median_tightness"] = number(row.median_tightness);
    j["violations"] = row.violations;
    j["unbounded"] = row.unbounded;
    j["worst_index"] = row.worst_index;
    j["worst_computed"] = number(row.worst_computed);
    j["worst_exact"] = number(row.worst_exact);
    j["worst_bound"] = number(row.worst_bound);
    j["tightness_per_ulp"] = number(row.tightness_per_ulp);
    j["stat_max_tightness"] = number(row.stat_max_tightness);
    j["row_statistic"] = number(row.row_statistic);
    j["suspicious"] = row.suspicious;
    return j;
}

Row row_from_json(const nlohmann::json& j) {
    const auto field = [&](const char* name) -> const nlohmann::json& {
        if (!j.is_object() || !j.contains(name))
            throw IoError(std::string("report: accuracy.json: a row has no field '") + name + "'");
        return j.at(name);
    };
    try {
        Row row;
        row.config = field("config").get<std::string>();
        Case& c = row.grid_case;
        c.sweep = field("sweep").get<std::string>();
        if (!j.contains("B")) {
            // Schema 3: the case, the implementation and the dtype from the config string alone.
            case_from_config(row.config, c, row.impl, row.dtype);
        } else {  // schemas 1 and 2 wrote them out
            row.impl = field("impl").get<std::string>();
            row.dtype = enum_from_string(field("dtype").get<std::string>(),
                                         {Dtype::Float, Dtype::Double, Dtype::Float16, Dtype::BFloat16}, "dtype");
            c.B = field("B").get<Index>();
            c.H = field("H").get<Index>();
            c.Tq = field("Tq").get<Index>();
            c.Tk = field("Tk").get<Index>();
            c.Dk = field("Dk").get<Index>();
            c.Dv = field("Dv").get<Index>();
            c.mask_kind = enum_from_string(field("mask").get<std::string>(),
                                           {MaskKind::None, MaskKind::CausalTopLeft, MaskKind::CausalBottomRight,
                                            MaskKind::Padding, MaskKind::Random, MaskKind::Window},
                                           "mask");
            c.distribution = enum_from_string(field("dist").get<std::string>(),
                                              {Distribution::Normal, Distribution::LargeLogits, Distribution::NearTies,
                                               Distribution::WideRange, Distribution::Subnormal},
                                              "dist");
            c.logit_std = number_from_json(field("logit_std"));
            c.softcap = j.contains("softcap") ? number_from_json(j.at("softcap")) : 0.0;
            c.bias = j.contains("bias") ? j.at("bias").get<std::string>() : "none";
            c.alibi = j.contains("alibi") ? j.at("alibi").get<std::string>() : "none";
        }
        row.error = field("error").is_null() ? "" : field("error").get<std::string>();
        row.elements = field("elements").get<Index>();
        row.max_ulp = number_from_json(field("max_ulp"));
        row.p99_ulp = number_from_json(field("p99_ulp"));
        row.max_abs = number_from_json(field("max_abs"));
        row.max_rel = number_from_json(field("max_rel"));
        row.normwise_rel = number_from_json(field("normwise_rel"));
        row.max_tightness = number_from_json(field("max_tightness"));
        row.median_tightness = number_from_json(field("median_tightness"));
        row.violations = field("violations").get<Index>();
        row.unbounded = field("unbounded").get<Index>();
        row.worst_index = field("worst_index").get<Shape>();
        row.worst_computed = number_from_json(field("worst_computed"));
        row.worst_exact = number_from_json(field("worst_exact"));
        row.worst_bound = number_from_json(field("worst_bound"));
        row.tightness_per_ulp = number_from_json(field("tightness_per_ulp"));
        // The statistical verdict's fields: absent from reports made before it.
        if (j.contains("stat_max_tightness")) row.stat_max_tightness = number_from_json(j.at("stat_max_tightness"));
        if (j.contains("row_statistic")) row.row_statistic = number_from_json(j.at("row_statistic"));
        if (j.contains("suspicious")) row.suspicious = j.at("suspicious").get<bool>();
        return row;
    } catch (const nlohmann::json::exception& e) {
        throw IoError(std::string("report: accuracy.json: malformed row: ") + e.what());
    }
}

nlohmann::json to_drift_json(const Row& row) {
    nlohmann::json j = {{"config", row.config}, {"sweep", row.grid_case.sweep}};
    j["error"] = row.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(row.error);
    j["max_ulp"] = number(row.max_ulp);
    j["max_tightness"] = number(row.max_tightness);
    j["violations"] = row.violations;
    j["unbounded"] = row.unbounded;
    j["tightness_per_ulp"] = number(row.tightness_per_ulp);
    return j;
}

Row row_from_drift_json(const nlohmann::json& j) {
    try {
        Row row;
        row.config = j.at("config").get<std::string>();
        row.grid_case.sweep = j.at("sweep").get<std::string>();
        std::string config = row.config;
        for (const char* prefix : gradient_prefixes)
            if (config.starts_with(prefix)) config = config.substr(std::string(prefix).size());
        case_from_config(config, row.grid_case, row.impl, row.dtype);
        row.error = j.at("error").is_null() ? "" : j.at("error").get<std::string>();
        row.max_ulp = number_from_json(j.at("max_ulp"));
        row.max_tightness = number_from_json(j.at("max_tightness"));
        row.violations = j.at("violations").get<Index>();
        row.unbounded = j.at("unbounded").get<Index>();
        row.tightness_per_ulp = number_from_json(j.at("tightness_per_ulp"));
        return row;
    } catch (const nlohmann::json::exception& e) {
        throw IoError(std::string("report: accuracy.json: malformed gradient row: ") + e.what());
    }
}

nlohmann::json to_json(const Summary& s) {
    return {{"impl", s.impl},
            {"dtype", to_string(s.dtype)},
            {"rows", s.rows},
            {"failed_rows", s.failed_rows},
            {"violations", s.violations},
            {"unbounded", s.unbounded},
            {"max_ulp", number(s.max_ulp)},
            {"max_p99_ulp", number(s.max_p99_ulp)},
            {"max_rel", number(s.max_rel)},
            {"max_tightness", number(s.max_tightness)},
            {"median_tightness", number(s.median_tightness)},
            {"worst_config", s.worst_config}};
}

}  // namespace attn::report
