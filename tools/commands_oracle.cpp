// `attn oracle`, `attn check` and `attn oracle-sweep`: the high-precision oracle and its bound on .npy files,
// a pass/fail check of anyone's output against that bound, and the oracle's self-check sweep.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attn/attn.hpp"
#include "attn/oracle/backward.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#if ATTN_HAVE_REPORTS
#include "attn/report/oracle_sweep.hpp"
#endif
#include "attention_inputs.hpp"
#include "attn/io/npy.hpp"
#include "commands.hpp"

namespace attn::cli {

namespace {

// The problem flags `attn oracle` and `attn check` share with `attn sdpa`.
struct ProblemArgs : AttentionArgs {
    std::string q_path, k_path, v_path, allowed_mask_path;
    int bits = 0;
    std::string model = "generic";
    Index key_block = 64;
    std::optional<double> stale_max;  // overrides the model's (lazy rescaling)
    std::optional<double> tanh_ulps;  // overrides the model's (soft-capping)
    std::string underflow;            // "", "gradual" or "ftz": overrides the model's
    bool block_partial_sums = false;  // tiled: each key block's sums are formed apart and then added
    bool sequential_sums = false;     // the sums over keys add one term at a time, in key order
    std::string dtype;                // --dtype: int16/uint16 files hold the bits of this 16-bit type
    Index logit_storage_roundings = 0;     // the logits (or their scale) rounded to the storage type this many times
    bool probabilities_in_storage = false;  // P rounded to the storage type before P V
};

struct OracleArgs : ProblemArgs {
    std::string out_path, bound_path, weights_path, weights_bound_path;
};

struct CheckArgs : ProblemArgs {
    std::string candidate_path, candidate_weights_path, json_path;
    std::string dout_path, candidate_dq_path, candidate_dk_path, candidate_dv_path;  // the backward pass
};

void add_problem_options(CLI::App* cmd, ProblemArgs& args) {
    cmd->add_option("--q", args.q_path, "Queries (..., Tq, Dk): float32, float64, float16 or bfloat16")->required();
    cmd->add_option("--k", args.k_path, "Keys (..., Tk, Dk), same dtype as q")->required();
    cmd->add_option("--v", args.v_path, "Values (..., Tk, Dv), same dtype as q")->required();
    cmd->add_option("--allowed-mask", args.allowed_mask_path,
                    "Bool mask broadcastable to (..., Tq, Tk); true = the query may read the key");
    add_attention_options(cmd, args, problem_option_fields);
    cmd->add_option("--tanh-ulps", args.tanh_ulps,
                    "Soft-capping: error of the kernel's tanh in ulps (generic and tiled 4, Highway's; reference 3, "
                    "glibc's measured 2.05; a GPU's tanh.approx needs about 8200 in float)")
        ->check(CLI::Range(0.0, 999999.0));
    cmd->add_option("--dtype", args.dtype,
                    "Read int16/uint16 inputs (and candidates) as the bits of this 16-bit type "
                    "(tensor.view(torch.int16).numpy())")
        ->check(CLI::IsMember({"bfloat16", "float16"}));
    cmd->add_option("--bits", args.bits,
                    "Oracle working precision: 0 = default (114-bit MPFR with exact double-double kernels); "
                    "otherwise all-MPFR at 114, 261 or 516 bits")
        ->capture_default_str()
        ->check(CLI::IsMember({0, 114, 261, 516}));
    cmd->add_option("--model", args.model,
                    "Error model of the implementation the bound is for: generic (unknown kernel), reference "
                    "(the library's reference backend) or tiled (online softmax, see --key-block)")
        ->capture_default_str()
        ->check(CLI::IsMember({"generic", "reference", "tiled"}));
    cmd->add_option("--key-block", args.key_block, "Key block of the tiled model (one rescaling per block)")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
    cmd->add_option("--stale-max", args.stale_max,
                    "Lazy rescaling: the kernel keeps a stale running max until a logit exceeds it by more than this "
                    "(natural exponent; generic assumes 5.6, FlashAttention-4's 8 in base 2; the others 0)")
        ->check(CLI::Range(0.0, 699.0));
    cmd->add_option("--underflow", args.underflow,
                    "Below the normal range the kernel rounds (gradual, IEEE CPUs) or may flush results and read "
                    "subnormal inputs as zero (ftz, GPUs); default: the model's (generic and tiled ftz, reference "
                    "gradual)")
        ->check(CLI::IsMember({"gradual", "ftz"}));
    cmd->add_flag("--block-partial-sums", args.block_partial_sums,
                  "Tiled model: the kernel forms each key block's sum of exps and of exps times values apart from "
                  "its running sums and adds it once (not accumulating into them, as an MMA with C = acc does)");
    cmd->add_option("--logit-storage-roundings", args.logit_storage_roundings,
                    "16-bit kernels: how many times each logit, or the scale it is multiplied by, is rounded to the "
                    "storage type before the softmax (1: q k^T stored in 16 bits; 2: then scaled in 16 bits too)")
        ->capture_default_str()
        ->check(CLI::Range(0, 2));
    cmd->add_flag("--probabilities-in-storage", args.probabilities_in_storage,
                  "16-bit kernels: the exps or the weights are rounded to the storage type before the P V product "
                  "(FlashAttention's forward; a 16-bit softmax followed by a 16-bit matmul); with --dout, the "
                  "backward's P and dS too, before their products (FlashAttention-2's backward)");
    cmd->add_flag("--sequential-sums", args.sequential_sums,
                  "The kernel's sum of exps and weighted sums add one key's term at a time, in key order (a plain "
                  "loop): the statistical verdict's row statistic then uses the exact partial sums");
}

SdpaOptions sdpa_options(const ProblemArgs& args) { return args.options<SdpaOptions>("attn"); }

using Inputs = AttentionFiles;

Inputs read_inputs(const char* command, const ProblemArgs& args) {
    return read_attention_files(command, args.q_path, args.k_path, args.v_path, args.allowed_mask_path, args.dtype,
                                args.bias_path, args.alibi_path);
}

// One oracle call as the flags describe it: the inputs as tensors of T, the options, the error model.
template <class T>
struct OracleCall {
    Tensor<T> q, k, v;
    std::optional<TensorView<const bool>> allowed;  // broadcastable to (..., Tq, Tk), in Inputs
    std::optional<Tensor<T>> bias, slopes;
    SdpaOptions options;
    oracle::OracleOptions oo;
};

template <class T>
OracleCall<T> oracle_call(const ProblemArgs& args, const Inputs& in, bool statistical) {
    OracleCall<T> c{npy::to_tensor<T>(in.q, args.q_path), npy::to_tensor<T>(in.k, args.k_path),
                    npy::to_tensor<T>(in.v, args.v_path), std::nullopt, in.bias_tensor<T>(), in.alibi_tensor<T>(),
                    sdpa_options(args), {}};
    if (in.allowed_mask) c.allowed = in.allowed_mask->view();
    oracle::OracleOptions& oo = c.oo;
    oo.bits = args.bits;
    oo.statistical = statistical;
    oo.model = oracle::model_by_name(args.model, args.key_block);
    if (args.stale_max) oo.model.stale_max = *args.stale_max;
    if (args.tanh_ulps) oo.model.tanh_ulps = *args.tanh_ulps;
    if (args.block_partial_sums) {
        if (args.model != "tiled")
            throw ConfigError("--block-partial-sums describes a tiled kernel's key blocks and needs --model tiled, "
                              "got --model " + args.model);
        oo.model.block_partial_sums = true;
    }
    oo.model.sequential_sums = args.sequential_sums;  // no named model claims it
    oo.model.logit_storage_roundings = args.logit_storage_roundings;
    oo.model.probabilities_in_storage = args.probabilities_in_storage;
    if (!args.underflow.empty()) {  // gradual: IEEE arithmetic throughout; ftz: results and inputs may be flushed
        oo.model.gradual_underflow = args.underflow == "gradual";
        oo.model.inputs_flushed = !oo.model.gradual_underflow;
    }
    if (c.bias) c.options.bias = *c.bias;
    if (c.slopes) c.options.alibi_slopes = *c.slopes;
    return c;
}

template <class T>
oracle::Result<T> run_oracle(const ProblemArgs& args, const Inputs& in, bool statistical = false) {
    const OracleCall<T> c = oracle_call<T>(args, in, statistical);
    return oracle::scaled_dot_product_attention<T>(c.q.view(), c.k.view(), c.v.view(), c.allowed, c.options, c.oo);
}

// ---- attn oracle ----------------------------------------------------------------------------------------------

template <class T>
void oracle_files(const OracleArgs& args, const Inputs& in) {
    const oracle::Result<T> r = run_oracle<T>(args, in);
    npy::write_file<T>(args.out_path, r.output.view());  // (..., Tq, Dv), correctly rounded
    if (!args.bound_path.empty()) npy::write_file<double>(args.bound_path, r.output_bound.view());
    if (!args.weights_path.empty()) npy::write_file<T>(args.weights_path, r.weights.view());  // (..., Tq, Tk)
    if (!args.weights_bound_path.empty()) npy::write_file<double>(args.weights_bound_path, r.weights_bound.view());
    std::cout << "attn oracle: " << to_string(r.output.shape()) << " output at " << r.bits << " bits, bound for the "
              << r.model.name << " model; the oracle's own error is below " << r.oracle_error_ratio
              << " of every bound\n";
}

int oracle_command(const OracleArgs& args) {
    const Inputs in = read_inputs("oracle", args);
    with_float_type(in.q.dtype, [&]<class T>() { oracle_files<T>(args, in); });
    return 0;
}

// ---- attn check -----------------------------------------------------------------------------------------------

// A number for JSON, which has no inf or nan.
nlohmann::json json_number(double x) {
    if (std::isfinite(x)) return x;
    return std::isnan(x) ? "nan" : (x > 0 ? "inf" : "-inf");
}

nlohmann::json to_json(const oracle::Comparison& c) {
    const auto num = json_number;
    return {{"pass", c.pass()},
            {"elements", c.elements},
            {"over_bound", c.violations},
            {"unbounded", c.unbounded},
            {"nonfinite_mismatches", c.nonfinite_mismatches},
            {"max_ulp", num(c.max_ulp)},
            {"max_abs", num(c.max_abs)},
            {"max_rel", num(c.max_rel)},
            {"normwise_rel", num(c.normwise_rel)},
            {"max_error_over_bound", num(c.max_tightness)},
            {"worst",
             {{"index", c.worst_index},
              {"computed", num(c.worst_computed)},
              {"exact", num(c.worst_exact)},
              {"bound", num(c.worst_bound)}}}};
}

void print_comparison(const char* what, const oracle::Comparison& c) {
    std::printf("%s: %s\n", what, c.pass() ? "pass" : "FAIL");
    std::printf("  max ULP error        %.4g\n", c.max_ulp);
    const std::string w = what;
    std::printf("  max relative error   %.4g   (relative to %s)\n", c.max_rel,
                w == "output" ? "sum_k p_k |V_k|" : w == "weights" ? "sum_k p_k |V_k|, here |p|" : "|exact|");
    std::printf("  normwise rel. error  %.4g\n", c.normwise_rel);
    std::printf("  max error / bound    %.4g\n", c.max_tightness);
    std::printf("  over the bound       %lld of %lld elements", static_cast<long long>(c.violations),
                static_cast<long long>(c.elements));
    if (c.nonfinite_mismatches) std::printf(" (%lld NaN/Inf mismatches)", static_cast<long long>(c.nonfinite_mismatches));
    if (c.unbounded) std::printf(" (%lld with an infinite bound)", static_cast<long long>(c.unbounded));
    std::printf("\n  worst element        %s: candidate %.17g, exact %.17g, bound %.3g\n", to_string(c.worst_index).c_str(),
                c.worst_computed, c.worst_exact, c.worst_bound);
}

// The 16-bit rounding choices of the error model, fewest places rounded to the storage type first (ties: the
// logits before P), from the ones the user asked for up: (logit roundings, P in storage).
std::vector<std::pair<Index, bool>> storage_rounding_ladder(const ProblemArgs& args) {
    std::vector<std::pair<Index, bool>> ladder;
    for (int places = 0; places <= 3; ++places)
        for (Index k = std::min<Index>(places, 2); k >= 0; --k) {
            const bool p = places - k == 1;
            if (places - k > 1 || k < args.logit_storage_roundings || (args.probabilities_in_storage && !p)) continue;
            if (k == args.logit_storage_roundings && p == args.probabilities_in_storage) continue;  // the one asked
            ladder.emplace_back(k, p);
        }
    return ladder;
}

std::string storage_flags(Index k, bool p) {
    std::string flags = k ? "--logit-storage-roundings " + std::to_string(k) : "";
    if (p) flags += std::string(flags.empty() ? "" : " ") + "--probabilities-in-storage";
    return flags.empty() ? "(no 16-bit roundings)" : flags;
}

// Checks the candidate under each looser choice of the ladder (every other choice of the model as asked), prints
// each verdict and names the first that fits; returns them as JSON. The exit status stays the verdict of the model
// asked for: a looser model that fits says how the kernel may round, not that it is right.
template <class T>
nlohmann::json first_storage_model_that_fits(const CheckArgs& args, const Inputs& in, TensorView<const T> candidate,
                                             std::optional<TensorView<const T>> weights) {
    nlohmann::json tried = nlohmann::json::array();
    std::optional<std::string> first;
    std::printf("16-bit rounding models (the %s model otherwise as asked), fewest roundings to %s first:\n",
                args.model.c_str(), npy::to_string(npy::dtype_of<T>()));
    for (const auto& [k, p] : storage_rounding_ladder(args)) {
        CheckArgs looser = args;
        looser.logit_storage_roundings = k;
        looser.probabilities_in_storage = p;
        const oracle::Result<T> r = run_oracle<T>(looser, in);
        const oracle::CheckVerdict v = oracle::check_candidate<T>(candidate, r, weights);
        const double tightness = std::max(v.output.max_tightness, v.weights ? v.weights->max_tightness : 0.0);
        std::printf("  %-55s %s (max error / bound %.3g)\n", storage_flags(k, p).c_str(), v.pass() ? "pass" : "FAIL",
                    tightness);
        tried.push_back({{"logit_storage_roundings", k}, {"probabilities_in_storage", p}, {"pass", v.pass()},
                         {"max_error_over_bound", json_number(tightness)}});
        if (v.pass() && !first) first = storage_flags(k, p);
    }
    if (first) std::printf("first model that fits: --model %s %s\n", args.model.c_str(), first->c_str());
    else std::printf("no 16-bit rounding model fits: the error is not explained by where the kernel rounds\n");
    return {{"tried", tried}, {"first_that_fits", first ? nlohmann::json(*first) : nlohmann::json(nullptr)}};
}

// What one check found: the exit status of its verdict and its JSON report.
struct CheckOutcome {
    int status = 0;
    nlohmann::json report;
};

template <class T>
CheckOutcome check_files(const CheckArgs& args, const Inputs& in, const npy::Array& candidate_file) {
    const oracle::Result<T> r = run_oracle<T>(args, in, true);
    const Tensor<T> candidate = npy::to_tensor<T>(candidate_file, args.candidate_path);
    if (candidate.shape() != r.output.shape())
        throw ShapeError("check: the candidate " + describe("output", args.candidate_path, candidate_file) +
                         " but the output of q, k, v is " + to_string(r.output.shape()));
    std::optional<Tensor<T>> candidate_weights;
    if (!args.candidate_weights_path.empty()) {
        const npy::Array wf = read_float_file(args.candidate_weights_path, args.dtype);
        candidate_weights = npy::to_tensor<T>(wf, args.candidate_weights_path);
        if (candidate_weights->shape() != r.weights.shape())
            throw ShapeError("check: the candidate " + describe("weights", args.candidate_weights_path, wf) +
                             " but the weights of q, k, v are " + to_string(r.weights.shape()));
    }
    std::optional<TensorView<const T>> weights_view;
    if (candidate_weights) weights_view = candidate_weights->view();
    const oracle::CheckVerdict verdict = oracle::check_candidate<T>(candidate.view(), r, weights_view);
    std::printf("attn check: %s against the oracle (%d bits), bound for the %s model, dtype %s\n",
                args.candidate_path.c_str(), r.bits, r.model.name.c_str(), npy::to_string(npy::dtype_of<T>()));
    print_comparison("output", verdict.output);
    if (verdict.weights) print_comparison("weights", *verdict.weights);
    const bool pass = verdict.pass();
    const bool suspicious = verdict.suspicious();
    const oracle::RowStatistic& rows = *verdict.statistical_rows;
    std::printf("statistical verdict (independent rounding errors, false alarm <= %.0e per call): %s\n",
                oracle::statistical_false_alarm, suspicious ? "SUSPICIOUS" : "not suspicious");
    std::printf("  output over the statistical bound   %lld of %lld (max error/bound %.3g)\n",
                static_cast<long long>(verdict.statistical_output->violations),
                static_cast<long long>(verdict.statistical_output->elements), verdict.statistical_output->max_tightness);
    if (verdict.statistical_weights)
        std::printf("  weights over the statistical bound  %lld of %lld (max error/bound %.3g)\n",
                    static_cast<long long>(verdict.statistical_weights->violations),
                    static_cast<long long>(verdict.statistical_weights->elements),
                    verdict.statistical_weights->max_tightness);
    std::printf("  row statistic                       %.4g over %lld rows, threshold %.4g%s\n", rows.sum_squares,
                static_cast<long long>(rows.rows), rows.threshold,
                r.structured_rows ? (" (" + std::to_string(r.structured_rows) + " structured rows left out)").c_str() : "");
    // A 16-bit candidate outside the bound: which places that round to the storage type would explain it.
    std::optional<nlohmann::json> storage_models;
    if constexpr (is_half_v<T>)
        if (!pass) storage_models = first_storage_model_that_fits<T>(args, in, candidate.view(), weights_view);
    nlohmann::json report;
    {
        report = {{"candidate", args.candidate_path},
                                 {"dtype", npy::to_string(npy::dtype_of<T>())},
                                 {"model", r.model.name},
                                 {"oracle_bits", r.bits},
                                 {"oracle_error_ratio", r.oracle_error_ratio},
                                 {"pass", pass},
                                 {"output", to_json(verdict.output)}};
        if (verdict.weights) report["weights"] = to_json(*verdict.weights);
        report["statistical"] = nlohmann::json{{"suspicious", suspicious},
                                 {"false_alarm_per_call", oracle::statistical_false_alarm},
                                 {"output", to_json(*verdict.statistical_output)},
                                 {"row_statistic",
                                  {{"rows", rows.rows},
                                   {"sum_squares", json_number(rows.sum_squares)},
                                   {"threshold", json_number(rows.threshold)},
                                   {"suspicious", rows.suspicious()}}},
                                 {"structured_rows", r.structured_rows}};
        if (verdict.statistical_weights) report["statistical"]["weights"] = to_json(*verdict.statistical_weights);
        if (storage_models) report["storage_models"] = *storage_models;
        // Every choice the bound was computed for (oracle/BOUNDS.md section 6), so a verdict can be reproduced.
        const oracle::ErrorModel& m = r.model;
        report["error_model"] = {{"name", m.name},
                                 {"exp_ulps", m.exp_ulps},
                                 {"rescalings", m.rescalings},
                                 {"key_block", m.key_block},
                                 {"block_partial_sums", m.block_partial_sums},
                                 {"sequential_sums", m.sequential_sums},
                                 {"scale_roundings", m.scale_roundings},
                                 {"shift_roundings", m.shift_roundings},
                                 {"rounded_max_shift", m.rounded_max_shift},
                                 {"stale_max", m.stale_max},
                                 {"tanh_ulps", m.tanh_ulps},
                                 {"split_kv", m.split_kv},
                                 {"log_ulps", m.log_ulps},
                                 {"reciprocal_normalisation", m.reciprocal_normalisation},
                                 {"gradual_underflow", m.gradual_underflow},
                                 {"inputs_flushed", m.inputs_flushed},
                                 {"logit_storage_roundings", m.logit_storage_roundings},
                                 {"probabilities_in_storage", m.probabilities_in_storage}};
    }
    // 3: within every rigorous bound, but suspicious to the statistical verdict (BOUNDS.md section 10).
    return {!pass ? 1 : suspicious ? 3 : 0, report};
}

// attn check --dout: the candidate gradients given against the exact ones and their bound (oracle/BOUNDS.md
// section 12; the model's forward part is --model's).
template <class T>
CheckOutcome check_gradient_files(const CheckArgs& args, const Inputs& in) {
    const OracleCall<T> c = oracle_call<T>(args, in, false);
    const npy::Array dout_file = read_float_file(args.dout_path, args.dtype);
    if (dout_file.dtype != in.q.dtype)
        throw ConfigError("check: dout must have q's dtype: " + describe("dout", args.dout_path, dout_file) + ", " +
                          describe("q", args.q_path, in.q));
    const Tensor<T> dout = npy::to_tensor<T>(dout_file, args.dout_path);
    const oracle::Gradients<T> g =
        oracle::sdpa_backward<T>(c.q.view(), c.k.view(), c.v.view(), dout.view(), c.allowed, c.options, c.oo);
    std::printf("attn check: gradients against the oracle's exact ones (%d bits), bound for a backward of the %s "
                "model (oracle/BOUNDS.md section 12; 12b where it takes P from the lse and D from the output), "
                "dtype %s\n",
                g.bits, g.model.name.c_str(), npy::to_string(npy::dtype_of<T>()));
    oracle::GradientVerdict verdict;
    nlohmann::json report = {{"dout", args.dout_path}, {"dtype", npy::to_string(npy::dtype_of<T>())},
                             {"model", g.model.name}, {"oracle_bits", g.bits}};
    const std::pair<const std::string*, oracle::Gradient> given[] = {{&args.candidate_dq_path, oracle::Gradient::Dq},
                                                                     {&args.candidate_dk_path, oracle::Gradient::Dk},
                                                                     {&args.candidate_dv_path, oracle::Gradient::Dv}};
    for (const auto& [path, which] : given) {
        if (path->empty()) continue;
        const char* name = oracle::gradient_name(which);
        const npy::Array file = read_float_file(*path, args.dtype);
        const Tensor<T> candidate = npy::to_tensor<T>(file, *path);
        const oracle::Comparison comparison = oracle::compare_gradient<T>(candidate.view(), g, which);
        print_comparison(name, comparison);
        (which == oracle::Gradient::Dq ? verdict.dq : which == oracle::Gradient::Dk ? verdict.dk : verdict.dv) =
            comparison;
        report[name] = to_json(comparison);
        report[name]["candidate"] = *path;
    }
    report["pass"] = verdict.pass();
    return {verdict.pass() ? 0 : 1, report};
}

int check_command(const CheckArgs& args) {
    const Inputs in = read_inputs("check", args);
    const bool gradients = !args.candidate_dq_path.empty() || !args.candidate_dk_path.empty() ||
                           !args.candidate_dv_path.empty();
    if (gradients != !args.dout_path.empty())
        throw ConfigError("check: --dout and at least one of --candidate-dq, --candidate-dk, --candidate-dv go "
                          "together (the gradients of sum(dout * output))");
    if (args.candidate_path.empty() && !gradients)
        throw ConfigError("check: give --candidate (the output), or --dout with --candidate-dq/-dk/-dv (gradients)");
    std::vector<CheckOutcome> outcomes;
    if (!args.candidate_path.empty()) {
        const npy::Array candidate = read_float_file(args.candidate_path, args.dtype);
        if (candidate.dtype != in.q.dtype)
            throw ConfigError("check: the candidate must have q's dtype (the bound is for that dtype): " +
                              describe("candidate", args.candidate_path, candidate) + ", " +
                              describe("q", args.q_path, in.q));
        outcomes.push_back(with_float_type(in.q.dtype, [&]<class T>() { return check_files<T>(args, in, candidate); }));
    }
    if (gradients)
        outcomes.push_back(with_float_type(in.q.dtype, [&]<class T>() { return check_gradient_files<T>(args, in); }));
    // One report: the output's fields at the top level as before, the gradients' under "gradients".
    nlohmann::json report = args.candidate_path.empty() ? nlohmann::json::object() : outcomes.front().report;
    if (gradients) report["gradients"] = outcomes.back().report;
    if (!args.json_path.empty()) {
        std::ofstream file(args.json_path);
        if (!file) throw IoError("check: cannot write " + args.json_path);
        file << report.dump(2) << "\n";
        if (!file) throw IoError("check: cannot write " + args.json_path);
    }
    int status = 0;  // 1 when any check fails, else 3 when the output is suspicious, else 0
    for (const CheckOutcome& o : outcomes) status = o.status == 1 || status == 1 ? 1 : std::max(status, o.status);
    return status;
}

// ---- attn oracle-sweep ----------------------------------------------------------------------------------------

struct SweepArgs {
    Index cases = 500;
    std::uint64_t seed = 20261130;
    std::string dtype = "both";
    std::string impl = "reference";
    bool compare_mpfr = false;
    std::string classes = "adversarial";
    bool generic_model = false;
};

int sweep_command(const SweepArgs& args) {
#if !ATTN_HAVE_REPORTS
    (void)args;
    std::cerr << "attn oracle-sweep: this build has no report library (it runs implementations of the suite)\n";
    return 2;
#else
    report::SweepOptions options;
    options.cases = args.cases;
    options.seed = args.seed;
    options.impl = args.impl;
    options.compare_mpfr = args.compare_mpfr;
    options.classes = args.classes;
    options.generic_model = args.generic_model;
    bool ok = true;
    const auto run = [&](auto tag) {
        using T = decltype(tag);
        const report::SweepStats st = report::oracle_sweep<T>(options);
        std::cout << st.summary() << "\n  worst: " << st.worst_summary << "\n";
        if (!st.first_violation.empty()) std::cout << "  first violation: " << st.first_violation << "\n";
        if (!st.first_unbounded.empty()) std::cout << "  first unbounded: " << st.first_unbounded << "\n";
        if (!st.first_suspicious.empty()) std::cout << "  first suspicious: " << st.first_suspicious << "\n";
        if (args.compare_mpfr)
            std::cout << "  against the all-MPFR path: " << st.mpfr_mismatches << " cases differ in a rounded bit"
                      << (st.first_mpfr_mismatch.empty() ? "" : ", the first " + st.first_mpfr_mismatch) << "\n";
        ok = ok && st.violations == 0 && st.unexplained_unbounded == 0 && st.mpfr_mismatches == 0 && st.suspicious == 0;
    };
    if (args.dtype != "double") run(float{});
    if (args.dtype != "float") run(double{});
    return ok ? 0 : 1;
#endif
}

}  // namespace

Action add_oracle_commands(CLI::App& app) {
    auto oargs = std::make_shared<OracleArgs>();
    auto* ocmd = app.add_subcommand("oracle", "High-precision attention on .npy files, correctly rounded, with a "
                                              "rigorous per-element error bound (oracle/BOUNDS.md)");
    add_problem_options(ocmd, *oargs);
    ocmd->add_option("--out", oargs->out_path, "Output (..., Tq, Dv) correctly rounded to q's dtype")->required();
    ocmd->add_option("--bound", oargs->bound_path, "Per-element bound on |computed - exact| (float64, --model)");
    ocmd->add_option("--weights", oargs->weights_path, "Also write the weights (..., Tq, Tk)");
    ocmd->add_option("--weights-bound", oargs->weights_bound_path, "And their per-element bound (float64)");

    auto cargs = std::make_shared<CheckArgs>();
    auto* ccmd = app.add_subcommand("check", "Check anyone's attention output (or gradients) against the oracle's bound; exit 0 when "
                                             "no element is over its bound, 1 when any is, 2 on bad input, 3 when "
                                             "none is but the statistical verdict finds it suspicious");
    add_problem_options(ccmd, *cargs);
    ccmd->add_option("--candidate", cargs->candidate_path, "The output to check (..., Tq, Dv), q's dtype");
    ccmd->add_option("--dout", cargs->dout_path,
                     "The backward pass: the output's gradient (..., Tq, Dv), q's dtype; the candidate gradients are "
                     "those of sum(dout * output)");
    ccmd->add_option("--candidate-dq", cargs->candidate_dq_path, "Gradient of q to check (q's shape), with --dout");
    ccmd->add_option("--candidate-dk", cargs->candidate_dk_path, "Gradient of k to check (k's shape), with --dout");
    ccmd->add_option("--candidate-dv", cargs->candidate_dv_path, "Gradient of v to check (v's shape), with --dout");
    ccmd->add_option("--candidate-weights", cargs->candidate_weights_path, "Also check weights (..., Tq, Tk)");
    ccmd->add_option("--json", cargs->json_path, "Write the comparison as JSON");

    auto sargs = std::make_shared<SweepArgs>();
    auto* scmd = app.add_subcommand("oracle-sweep", "The oracle's self-check: an implementation (the reference backend) "
                                                    "against its bound over random and adversarial cases; worst and "
                                                    "median tightness");
    scmd->add_option("--impl", sargs->impl, "Implementation (a registry name)")->capture_default_str();
    scmd->add_option("--cases", sargs->cases, "Cases per dtype")->capture_default_str()->check(CLI::PositiveNumber);
    scmd->add_option("--seed", sargs->seed, "RNG seed")->capture_default_str();
    scmd->add_flag("--compare-mpfr", sargs->compare_mpfr,
                   "Also run each case on the all-MPFR path and require bitwise the same rounded outputs and weights");
    scmd->add_option("--classes", sargs->classes,
                     "Case classes: adversarial (logits up to 1e4, near-ties, wide values, masks) or stagnation "
                     "(attention sinks, one-hot-ish rows, values in [1, 2), bfloat16 and small-integer data, Tk up to "
                     "16384)")
        ->capture_default_str()
        ->check(CLI::IsMember({"adversarial", "stagnation"}));
    scmd->add_flag("--generic-model", sargs->generic_model,
                   "Judge every case under the generic model instead of the implementation's own");
    scmd->add_option("--dtype", sargs->dtype, "float, double or both")
        ->capture_default_str()
        ->check(CLI::IsMember({"float", "double", "both"}));

    return [ocmd, oargs, ccmd, cargs, scmd, sargs]() -> int {
        if (ocmd->parsed()) return oracle_command(*oargs);
        if (ccmd->parsed()) return check_command(*cargs);
        if (scmd->parsed()) return sweep_command(*sargs);
        return not_mine;
    };
}

}  // namespace attn::cli
