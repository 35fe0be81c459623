// fuzz/candidate.hpp: which attention implementation a fuzz target checks, and the oracle comparison for small cases.
// It does not use the library's contract module (attn/detail/problem.hpp), on purpose: what a target expects comes
// from the independent model in decode.hpp, so a contract bug cannot hide in both.
//
// By default the targets check the library (attn::scaled_dot_product_attention). When the implementation registry
// is linked (ATTN_FUZZ_HAVE_SUITE), ATTN_FUZZ_IMPL=<name> selects any registered implementation instead, which is
// how the mutants are run under the fuzzers (`attn fuzz --mutants`), and ATTN_FUZZ_KERNEL=<file> an external
// kernel library (attn/kernel_abi.h; `attn fuzz --kernel`), run in its worker process: a crash or a hang there
// comes back as an exception, which the target reports as a finding like any other failed check.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "decode.hpp"

#include "attn/tiled.hpp"
#if ATTN_FUZZ_HAVE_ORACLE
#include "attn/oracle/metrics.hpp"
#include "attn/oracle/oracle.hpp"
#endif
#if ATTN_FUZZ_HAVE_SUITE
#include "attn/suite/registry.hpp"
#endif

namespace attn::fuzz {

// Thrown for an input the candidate does not support (an external kernel's undeclared mask kind, dtype, ...): the
// target rejects the input (libFuzzer keeps it out of the corpus). Not a std::exception, so that no check's
// handler of unexpected exceptions takes it for a failure.
struct SkipInput {};

// The entry point of the sdpa and backward targets: the first byte picks double; otherwise the profile byte after
// the dimensions picks float or a 16-bit type (sixteen_bit_choice), read ahead on a second reader of the same bytes.
// run(tag, in) decodes the rest for the type of `tag`. An input the candidate does not support returns -1 (kept out
// of the corpus).
template <class Run>
int run_in_decoded_dtype(const std::uint8_t* data, std::size_t size, Run&& run) {
    FuzzedDataProvider in(data, size);
    try {
        if (in.ConsumeBool()) {
            run(double{}, in);
        } else {
            FuzzedDataProvider ahead(data, size);
            (void)ahead.ConsumeBool();
            (void)Dims::decode(ahead);
            switch (sixteen_bit_choice((ahead.ConsumeIntegral<std::uint8_t>() >> 2) & 7u)) {
                case 16: run(float16{}, in); break;
                case 8: run(bfloat16{}, in); break;
                default: run(float{}, in); break;
            }
        }
    } catch (const SkipInput&) {
        return -1;
    }
    return 0;
}

#if ATTN_FUZZ_HAVE_SUITE
inline const suite::Implementation* candidate_implementation() {
    static const suite::Implementation* impl = []() -> const suite::Implementation* {
        if (const char* kernel = std::getenv("ATTN_FUZZ_KERNEL"); kernel && *kernel) {
            try {
                const suite::Implementation& loaded = suite::load_external(kernel);
                if (std::getenv("ATTN_FUZZ_PRINT_KERNEL")) {  // `attn fuzz --kernel` asks for the name, no more
                    std::printf("attn fuzz kernel: %s\n", loaded.name.c_str());
                    std::exit(0);
                }
                return &loaded;
            } catch (const std::exception& e) {
                std::fprintf(stderr, "attn fuzz: %s\n", e.what());
                std::exit(2);
            }
        }
        const char* name = std::getenv("ATTN_FUZZ_IMPL");
        return name && *name && std::string(name) != "library" ? &suite::implementation(name) : nullptr;
    }();
    return impl;
}

// Chosen at start: an external kernel is loaded (or refused, exit 2) before the first input.
inline const bool candidate_chosen_at_start = (candidate_implementation(), true);

// impl.run, with an input it does not support turned into SkipInput.
template <class T>
SdpaResult<T> run_implementation(const suite::Implementation& impl, TensorView<const T> q, TensorView<const T> k,
                                 TensorView<const T> v, std::optional<TensorView<const bool>> allowed_mask,
                                 const SdpaOptions& options) {
    try {
        return impl.template run<T>(q, k, v, allowed_mask, options);
    } catch (const suite::Unsupported&) {
        throw SkipInput{};
    }
}
#endif

// The name of the implementation under test ("library" when none is selected).
inline const std::string& candidate_name() {
    static const std::string name = [] {
#if ATTN_FUZZ_HAVE_SUITE
        if (const suite::Implementation* impl = candidate_implementation()) return impl->name;
#endif
        const char* env = std::getenv("ATTN_FUZZ_IMPL");
        return std::string(env && *env ? env : "library");
    }();
    return name;
}

template <class T>
SdpaResult<T> run_candidate(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                            std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
#if ATTN_FUZZ_HAVE_SUITE
    if (const suite::Implementation* impl = candidate_implementation()) {
        if (options.return_weights && !impl->returns_weights) throw SkipInput{};  // the checks expect weights
        return run_implementation<T>(*impl, q, k, v, allowed_mask, options);
    }
#endif
    return scaled_dot_product_attention(q, k, v, allowed_mask, options);
}

// Whether errors are expected to carry the library's "sdpa: " prefix (a registered implementation may name
// itself differently).
inline bool candidate_is_library() { return candidate_name() == "library"; }

// Cases this small go to the oracle (MPFR is ~1000x slower than the kernel; this keeps a case to a few ms).
inline bool small_enough_for_oracle(Index batch, Index Tq, Index Tk, Index Dk, Index Dv) {
    return batch * Tq * Tk * (Dk + Dv + 1) <= 6144;
}

#if ATTN_FUZZ_HAVE_ORACLE
// The error model the bound is computed for: the selected implementation's, or the library backend's.
inline oracle::ErrorModel candidate_error_model(const SdpaOptions& options) {
#if ATTN_FUZZ_HAVE_SUITE
    if (const suite::Implementation* impl = candidate_implementation()) return impl->error_model;
#endif
    return options.backend == Backend::Tiled ? oracle::library_tiled_model() : oracle::reference_model();
}

// Whether the candidate should round as its model says: the library, or a correct implementation of the registry.
// Those must never be suspicious to the statistical verdict either (oracle/BOUNDS.md section 10); a mutant is
// held to the rigorous bound alone.
inline bool candidate_is_correct() {
#if ATTN_FUZZ_HAVE_SUITE
    if (const suite::Implementation* impl = candidate_implementation()) return !impl->is_mutant;
#endif
    return true;
}

// The candidate's output (and weights, when returned) against the oracle: error <= bound everywhere, and for a
// correct candidate not suspicious to the statistical verdict.
template <class T>
void require_within_oracle_bound(const SdpaResult<T>& result, TensorView<const T> q, TensorView<const T> k,
                                 TensorView<const T> v, std::optional<TensorView<const bool>> allowed_mask,
                                 const SdpaOptions& options,
                                 std::optional<oracle::ErrorModel> model = std::nullopt, const std::string& who = "") {
    oracle::OracleOptions oracle_options;
    oracle_options.model = model ? *model : candidate_error_model(options);
    oracle_options.statistical = candidate_is_correct();
    oracle::Result<T> exact;
    try {
        exact = oracle::scaled_dot_product_attention<T>(q, k, v, allowed_mask, options, oracle_options);
    } catch (const Error& e) {
        fail(__FILE__, __LINE__, std::string("the oracle rejects a case the implementation accepted: ") + e.what());
    }
    const oracle::Comparison out = oracle::compare_output<T>(result.output.view(), exact);
    ATTN_FUZZ_REQUIRE(out.pass(), who + "output outside the oracle's bound: " + out.summary());
    if (result.weights) {
        const oracle::Comparison w = oracle::compare_weights<T>(result.weights->view(), exact);
        ATTN_FUZZ_REQUIRE(w.pass(), who + "weights outside the oracle's bound: " + w.summary());
    }
    if (!oracle_options.statistical) return;
    const oracle::CheckVerdict verdict = oracle::check_candidate<T>(
        result.output.view(), exact,
        result.weights ? std::optional<TensorView<const T>>(result.weights->view()) : std::nullopt);
    ATTN_FUZZ_REQUIRE(!verdict.suspicious(),
                      who + "within the bound but suspicious to the statistical verdict (its model is wrong here): "
                            "output " + verdict.statistical_output->summary() +
                            (verdict.statistical_weights ? "; weights " + verdict.statistical_weights->summary() : "") +
                            "; row statistic " + std::to_string(verdict.statistical_rows->sum_squares) + " of " +
                            std::to_string(verdict.statistical_rows->threshold));
}
#endif

}  // namespace attn::fuzz

// libFuzzer (and AFL++'s driver) call this once before fuzzing. ATTN_FUZZ_LIST_MUTANTS=1 lists the registered
// mutants and exits, so `attn fuzz --mutants` needs no link to the registry itself. Each target includes this
// header from exactly one translation unit.
extern "C" int LLVMFuzzerInitialize(int*, char***) {
    if (const char* list = std::getenv("ATTN_FUZZ_LIST_MUTANTS"); list && *list == '1') {
#if ATTN_FUZZ_HAVE_SUITE
        for (const attn::suite::Implementation* impl : attn::suite::mutants()) std::printf("mutant: %s\n", impl->name.c_str());
#endif
        std::exit(0);
    }
    if (attn::fuzz::candidate_name() != "library") {
#if ATTN_FUZZ_HAVE_SUITE
        (void)attn::fuzz::candidate_implementation();  // an unknown name fails here, before any input
#else
        std::fprintf(stderr, "attn-fuzz: ATTN_FUZZ_IMPL=%s needs the implementation registry\n",
                     attn::fuzz::candidate_name().c_str());
        std::exit(2);
#endif
    }
    return 0;
}
