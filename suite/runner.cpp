// The property runner: RapidCheck drives the generators, failures become case files, coverage is enforced.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <cstdio>
#include <limits>
#include <sstream>

#include <cassert>
#include <rapidcheck.h>
#include <rapidcheck/detail/Configuration.h>
#include <rapidcheck/detail/Results.h>
#include <rapidcheck/detail/TestListener.h>

#include "attn/detail/problem.hpp"
#include "attn/suite/property.hpp"
#include "checks.hpp"

namespace attn::suite {

// A run tops up its cases with fresh seeds up to this many rounds until the coverage contract is met.
constexpr int kCoverageRounds = 8;

const char* to_string(Regime r) {
    switch (r) {
        case Regime::TieForRowMax: return "exact tie for a row maximum";
        case Regime::MaskedLogit: return "-inf logit from a mask";
        case Regime::ExpOverflowLogits: return "logits beyond exp's overflow threshold";
        case Regime::Subnormal: return "subnormal input";
        case Regime::SingleAllowedKey: return "row with a single allowed key";
        case Regime::LongRows: return "Tk >= 64 (Tk*u not negligible)";
        case Regime::MaskRank2: return "mask of rank 2";
        case Regime::MaskRank3: return "mask of rank 3";
        case Regime::MaskRank4: return "mask of rank 4";
        case Regime::MaskStride0: return "stride-0 mask view";
        case Regime::GroupedKv: return "K/V heads broadcast or grouped";
    }
    return "?";
}

std::set<Regime> numeric_regimes() {
    return {Regime::TieForRowMax, Regime::MaskedLogit, Regime::ExpOverflowLogits, Regime::Subnormal,
            Regime::SingleAllowedKey, Regime::LongRows};
}
std::set<Regime> broadcast_regimes() {
    return {Regime::MaskRank2, Regime::MaskRank3, Regime::MaskRank4, Regime::MaskStride0, Regime::GroupedKv};
}

std::set<Regime> classify(const SdpaCase& c) {
    std::set<Regime> r;
    if (c.Tk >= 64) r.insert(Regime::LongRows);
    if (c.kv_heads != c.H) r.insert(Regime::GroupedKv);
    if (c.allowed_mask) {
        if (c.mask_stride0) r.insert(Regime::MaskStride0);
        const Index rank = c.allowed_mask->rank();
        r.insert(rank == 2 ? Regime::MaskRank2 : rank == 3 ? Regime::MaskRank3 : Regime::MaskRank4);
    }
    const double min_normal = gen::min_normal(c.dtype);
    for (const Tensor<double>* t : {&c.q, &c.k, &c.v})
        for (Index x = 0; x < t->numel(); ++x)
            if ((*t)[x] != 0 && std::abs((*t)[x]) < min_normal) r.insert(Regime::Subnormal);
    const long double log_max = gen::log_max(c.dtype);
    try {
        const CaseInputs<double> in = make_inputs<double>(c);
        const SdpaProblem<double> p =
            make_sdpa_problem<double>("suite.classify", in.q_view, in.k_view, in.v_view, in.allowed_view,
                                      in.with_bias(c.options));
        for (Index b = 0; b < p.batch; ++b)
            for (Index i = 0; i < p.Tq; ++i) {
                Index allowed = 0, at_max = 0;
                bool masked = false;
                long double row_max = -std::numeric_limits<long double>::infinity();
                for (Index j = 0; j < p.Tk; ++j) {
                    if (!p.allowed(b, i, j)) {
                        masked = true;
                        continue;
                    }
                    ++allowed;
                    long double s = 0;
                    for (Index d = 0; d < p.Dk; ++d)
                        s += static_cast<long double>(p.q_row(b, i)[d * p.q.stride(-1)]) * p.k_row(b, j)[d * p.k.stride(-1)];
                    s *= p.scale;
                    if (s > row_max) row_max = s, at_max = 1;
                    else if (s == row_max) ++at_max;
                }
                if (allowed == 0) continue;
                if (masked) r.insert(Regime::MaskedLogit);
                if (allowed == 1) r.insert(Regime::SingleAllowedKey);
                if (at_max >= 2) r.insert(Regime::TieForRowMax);
                if (row_max > log_max) r.insert(Regime::ExpOverflowLogits);
            }
    } catch (const Error&) {
        // A case the library rejects (property-specific) has no logit regimes.
    }
    return r;
}

bool window_allows(const SlidingWindow& w, Index i, Index j, Index Tq, Index Tk) {
    const Index shift = w.alignment == CausalAlignment::BottomRight ? Tk - Tq : 0;
    const bool left_ok = w.left == -1 || i + shift - w.left <= j;
    const bool right_ok = w.right == -1 || j <= i + shift + w.right;
    return left_ok && right_ok;
}

void drop_positional_options(SdpaCase& c) {
    c.options.is_causal = false;
    c.options.window.reset();
}

SdpaCase with_blocking_as_bias(const SdpaCase& c) {
    const Tensor<bool> allowed = expanded_allowed(c);
    Tensor<double> bias = expanded_bias(c);
    for (Index x = 0; x < bias.numel(); ++x)
        if (!allowed[x]) bias[x] = -std::numeric_limits<double>::infinity();
    SdpaCase r = c;
    r.allowed_mask.reset();
    r.mask_stride0 = false;
    r.mask_kind = "none";
    drop_positional_options(r);
    r.bias = std::move(bias);
    r.bias_kind = "mask";
    return r;
}

Tensor<bool> expanded_allowed(const SdpaCase& c) {
    Tensor<bool> full({c.B, c.H, c.Tq, c.Tk}, true);
    std::optional<TensorView<const bool>> m;
    if (c.allowed_mask) m = c.allowed_mask->view().broadcast_to({c.B, c.H, c.Tq, c.Tk}, "suite", "allowed_mask");
    const Tensor<double> bias = expanded_bias(c);
    for (Index b = 0; b < c.B; ++b)
        for (Index h = 0; h < c.H; ++h)
            for (Index i = 0; i < c.Tq; ++i)
                for (Index j = 0; j < c.Tk; ++j) {
                    const Index x = ((b * c.H + h) * c.Tq + i) * c.Tk + j;
                    bool a = !m || (*m)({b, h, i, j});
                    if (c.options.is_causal) a = a && causal_allows(i, j, c.Tq, c.Tk, c.options.alignment);
                    if (c.options.window) a = a && window_allows(*c.options.window, i, j, c.Tq, c.Tk);
                    a = a && bias[x] != -std::numeric_limits<double>::infinity();  // a -inf bias blocks the key
                    full[x] = a;
                }
    return full;
}

Tensor<double> expanded_bias(const SdpaCase& c) {
    Tensor<double> full({c.B, c.H, c.Tq, c.Tk}, 0.0);
    if (!c.bias) return full;
    const TensorView<const double> bias = c.bias->view().broadcast_to({c.B, c.H, c.Tq, c.Tk}, "suite", "bias");
    Index x = 0;
    for (Index b = 0; b < c.B; ++b)
        for (Index h = 0; h < c.H; ++h)
            for (Index i = 0; i < c.Tq; ++i)
                for (Index j = 0; j < c.Tk; ++j) full[x++] = bias({b, h, i, j});
    return full;
}

Verdict check_case(const Property& p, const Implementation& impl, const SdpaCase& c) {
    try {
        return p.check(impl, c);
    } catch (const Unsupported&) {
        throw;  // the runner skips the case
    } catch (const std::exception& e) {
        return std::string("the check threw: ") + e.what();
    }
}

std::string replay_command(const std::string& case_file, const std::string& kernel_path) {
    return "./attn properties " + (kernel_path.empty() ? "" : "--kernel '" + kernel_path + "' ") + "--replay '" + case_file + "'";
}

std::string describe_settings(const RunSettings& s) {
    return "RapidCheck seed " + std::to_string(s.seed) + " (reproduce with RC_PARAMS=\"seed=" + std::to_string(s.seed) +
           "\"), " + std::to_string(s.cases) + " cases per property and dtype (divided by a property's cost; up to " +
           std::to_string(kCoverageRounds) + "x that until its coverage contract is met), max_size " +
           std::to_string(s.max_size);
}

RunSettings settings_from_environment(bool thorough) {
    const auto& conf = rc::detail::configuration();
    RunSettings s;
    s.seed = conf.testParams.seed;
    s.cases = conf.testParams.maxSuccess * (thorough ? 20 : 1);
    s.max_size = std::min(conf.testParams.maxSize, 100);
    s.shrink = !conf.testParams.disableShrinking;
    return s;
}

namespace {

// Keeps RapidCheck from printing progress and, at exit, reproduce strings (which do not work under the Catch
// integration anyway): the suite reports and saves failures itself.
class QuietListener : public rc::detail::TestListener {
public:
    void onTestCaseFinished(const rc::detail::CaseDescription&) override {}
    void onShrinkTried(const rc::detail::CaseDescription&, bool) override {}
    void onTestFinished(const rc::detail::TestMetadata&, const rc::detail::TestResult&) override {}
};

}  // namespace

RunOutcome run_property(const Property& p, const Implementation& impl, Dtype dtype, const RunSettings& settings) {
    const auto t0 = std::chrono::steady_clock::now();
    RunOutcome out;
    if (const auto no = impl.dtype_unsupported.find(dtype); no != impl.dtype_unsupported.end()) {
        out.passed = out.skipped_all = true;
        out.skipped[no->second] = 0;
        out.message = "skipped: " + no->second;
        return out;
    }
    if (p.needs_bias && !impl.bias_unsupported.empty()) {
        out.passed = out.skipped_all = true;
        out.skipped[impl.bias_unsupported] = 0;
        out.message = "skipped: " + impl.bias_unsupported;
        return out;
    }
    const rc::Gen<SdpaCase> gen = p.generator(dtype);
    std::set<Regime> hit, hit_by_skipped;  // regimes of the cases judged, and of the cases skipped
    std::optional<std::pair<SdpaCase, std::string>> last_failure;
    int evaluated = 0;
    const auto body = [&] {
        const SdpaCase c = *gen;
        ++evaluated;
        const std::set<Regime> regimes = p.required.empty() ? std::set<Regime>{} : classify(c);
        Verdict v;
        try {
            v = check_case(p, impl, c);
        } catch (const Unsupported& e) {
            ++out.skipped[e.what()];
            hit_by_skipped.insert(regimes.begin(), regimes.end());
            RC_DISCARD("unsupported");
        }
        hit.insert(regimes.begin(), regimes.end());
        if (v) {
            last_failure = {c, *v};  // shrinking moves to every failing candidate: the last one is the minimum
            RC_FAIL(config_string(c, impl.name) + ": " + *v);
        }
    };
    rc::detail::TestMetadata meta;
    meta.id = p.name + "/" + impl.name + "/" + to_string(dtype);
    meta.description = p.sentence;
    rc::detail::TestParams params;
    params.maxSuccess = std::max(1, settings.cases * std::max(1, p.breadth) / std::max(1, p.cost));
    params.maxSize = std::min(settings.max_size, 100);
    params.disableShrinking = !settings.shrink;
    // An implementation that skips what it does not support may skip most of a property's cases.
    if (!impl.kernel_path.empty()) params.maxDiscardRatio = 100;
    // Coverage contract: the regimes must be hit within the budget, topped up to eight times the budget with
    // fresh seeds before the run fails. The generator weights reach each regime with probability >= 5% per case
    // (the rarest, a rank-3 mask, about 7.7%: 3/13 random masks x 1/3 ranks), so a correct generator misses one of
    // the 11 regimes in 800 cases with probability below 11 x 0.95^800 ~ 2e-17: a coverage failure means the
    // generator (or a property's own generator) lost a regime, never bad luck.
    std::set<Regime> missing;
    for (int round = 0; round < kCoverageRounds; ++round) {
        params.seed = settings.seed + static_cast<std::uint64_t>(round) * 0x9e3779b97f4a7c15ULL;
        QuietListener listener;
        const rc::detail::TestResult result = rc::detail::checkTestable(body, meta, params, listener);
        if (result.template is<rc::detail::FailureResult>()) {
            const auto f = result.template get<rc::detail::FailureResult>();
            out.passed = false;
            out.cases += f.numSuccess + 1;
            out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            out.message = f.description;
            if (last_failure) {
                out.counterexample = last_failure->first;
                out.config = config_string(last_failure->first, impl.name);
                out.message = out.config + ": " + last_failure->second;
                if (!settings.regressions_dir.empty()) {
                    CaseFile file;
                    file.sdpa = last_failure->first;
                    file.property = p.name;
                    file.implementation = impl.name;
                    file.note = "found by the suite (seed " + std::to_string(params.seed) + "): " + last_failure->second;
                    file.source = "found by the suite";
                    out.case_file = write_case_file(file, settings.regressions_dir);
                    if (impl.replay_template.empty()) {
                        out.reproduce = replay_command(out.case_file, impl.kernel_path);
                    } else {
                        out.reproduce = impl.replay_template;
                        out.reproduce.replace(out.reproduce.find("{case}"), 6, out.case_file);
                    }
                }
            }
            return out;
        }
        if (result.template is<rc::detail::GaveUpResult>() && !out.skipped.empty() &&
            result.template get<rc::detail::GaveUpResult>().numSuccess == 0) {
            out.passed = true;
            out.skipped_all = true;
            out.message = "skipped: every case needs what the implementation does not support";
            out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            return out;
        }
        if (!result.template is<rc::detail::SuccessResult>()) {
            std::ostringstream s;
            rc::detail::printResultMessage(result, s);
            out.passed = false;
            out.message = "RapidCheck gave up: " + s.str();
            out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
            return out;
        }
        out.cases += result.template get<rc::detail::SuccessResult>().numSuccess;
        missing.clear();
        for (Regime r : p.required)
            if (!hit.count(r)) missing.insert(r);
        if (missing.empty() || !settings.enforce_coverage) break;
    }
    out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    // A regime that only skipped cases reached is out of the implementation's reach, not lost by the generator.
    std::set<Regime> out_of_reach;
    for (Regime r : missing)
        if (hit_by_skipped.count(r)) out_of_reach.insert(r);
    for (Regime r : out_of_reach) missing.erase(r);
    if (!missing.empty() && settings.enforce_coverage) {
        out.passed = false;
        out.message = "coverage contract not met after " + std::to_string(out.cases) + " cases; never reached:";
        for (Regime r : missing) out.message += std::string(" [") + to_string(r) + "]";
        return out;
    }
    out.passed = true;
    out.message = std::to_string(out.cases) + " cases";
    if (!p.required.empty()) {
        out.message += ", coverage contract met (" + std::to_string(p.required.size() - out_of_reach.size()) + " regimes";
        if (!out_of_reach.empty()) {
            out.message += "; reached only by skipped cases:";
            for (Regime r : out_of_reach) out.message += std::string(" [") + to_string(r) + "]";
        }
        out.message += ")";
    }
    return out;
}

std::vector<std::string> replay_case(const CaseFile& file, std::vector<std::string>* skipped) {
    std::vector<std::string> problems;
    const Property& p = property(file.property);
    // A case outside what an implementation supports is reported as skipped for it, and judged nowhere.
    const auto verdict = [&](const Implementation& impl) -> Verdict {
        try {
            return check_case(p, impl, file.sdpa);
        } catch (const Unsupported& e) {
            if (skipped) skipped->push_back(impl.name + " (" + e.what() + ")");
            return std::nullopt;
        }
    };
    std::vector<const Implementation*> targets;
    if (file.implementation == "*") {
        targets = correct_implementations();
    } else {
        if (const Implementation* impl = find_implementation(file.implementation)) targets.push_back(impl);
        else if (skipped) skipped->push_back(file.implementation);
    }
    for (const Implementation* impl : targets)
        if (const Verdict v = verdict(*impl))
            problems.push_back(p.name + " fails for " + impl->name + " on " + config_string(file.sdpa, impl->name) + ": " + *v);
    for (const std::string& name : file.kills) {
        const Implementation* mutant = find_implementation(name);
        if (!mutant) {
            problems.push_back("mutant " + name + " named in the case file is not registered");
            continue;
        }
        if (!verdict(*mutant)) problems.push_back("mutant " + name + " survives this case of " + p.name);
    }
    return problems;
}

std::vector<MutantRow> mutant_table(const RunSettings& settings, std::ostream* progress) {
    RunSettings quick = settings;
    quick.shrink = false;
    quick.enforce_coverage = false;
    quick.regressions_dir.clear();
    std::vector<MutantRow> rows;
    for (const Implementation* m : mutants()) {
        MutantRow row;
        row.mutant = m->name;
        row.description = m->description;
        for (const Property& p : properties()) {
            if (!p.applies(*m)) continue;
            for (Dtype dtype : all_dtypes()) {
                if (m->dtype_unsupported.count(dtype)) continue;
                const RunOutcome o = run_property(p, *m, dtype, quick);
                row.cases += o.cases;
                row.seconds += o.seconds;
                if (!o.passed) {
                    row.killed = true;
                    row.killed_by = p.name;
                    row.dtype = to_string(dtype);
                    row.config = o.config;
                    row.reason = o.message;
                    break;
                }
            }
            if (row.killed) break;
        }
        if (progress) {
            *progress << "  " << row.mutant << ": " << (row.killed ? "killed by " + row.killed_by + " (" + row.dtype + ")" : "SURVIVED")
                      << ", " << row.cases << " cases, " << row.seconds << " s\n";
            progress->flush();
        }
        rows.push_back(std::move(row));
    }
    return rows;
}

std::string format_mutant_table(const std::vector<MutantRow>& rows) {
    std::ostringstream s;
    s << "| mutant | result | first killing property | cases | seconds |\n|---|---|---|---:|---:|\n";
    int killed = 0;
    double total = 0;
    for (const MutantRow& r : rows) {
        killed += r.killed;
        total += r.seconds;
        char secs[32];
        std::snprintf(secs, sizeof secs, "%.2f", r.seconds);
        s << "| " << r.mutant << " | " << (r.killed ? "killed" : "**survived**") << " | "
          << (r.killed ? r.killed_by + " (" + r.dtype + ")" : "-") << " | " << r.cases << " | " << secs << " |\n";
    }
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.1f", total);
    s << "\nmutation score: " << killed << "/" << rows.size() << " killed, " << secs << " s in total\n";
    return s.str();
}

const Property& property(const std::string& name) {
    for (const Property& p : properties())
        if (p.name == name) return p;
    std::string known;
    for (const Property& p : properties()) known += " " + p.name;
    throw ConfigError("suite: no property named '" + name + "'; known:" + known);
}

}  // namespace attn::suite
