// Oracle speed: cases per second at (Tq, Tk, D) = (16,16,16) and (64,64,64), float and double targets, for the
// default path (MPFR 114 bits + double-double kernels) and the backends it was chosen against.
#include <benchmark/benchmark.h>

#include <random>

#include "attn/oracle/oracle.hpp"
#include "types.hpp"

namespace {

using attn::Index;
using attn::Tensor;
namespace oracle = attn::oracle;

template <class T>
Tensor<T> random_tensor(attn::Shape shape, std::uint64_t seed) {
    Tensor<T> t(std::move(shape));
    std::mt19937_64 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(normal(rng));
    return t;
}

// One case: q (1, T, D), k (1, T, D), v (1, T, D). bits 0 = the default path; backend picks the Real type.
template <class T>
void oracle_case(benchmark::State& state, oracle::detail::Backend backend, int bits, bool statistical = false) {
    const Index T_ = state.range(0), D = state.range(0);
    const Tensor<T> q = random_tensor<T>({1, T_, D}, 1), k = random_tensor<T>({1, T_, D}, 2),
                    v = random_tensor<T>({1, T_, D}, 3);
    oracle::OracleOptions options;
    options.bits = bits;
    options.statistical = statistical;
    for (auto _ : state) {
        auto r = oracle::solve_with_backend<T>(q, k, v, std::nullopt, {}, options, backend);
        benchmark::DoNotOptimize(r.output.data());
    }
    state.counters["cases_per_s"] = benchmark::Counter(static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}

using B = oracle::detail::Backend;
void BM_Oracle_Float_Mpfr114_Fast(benchmark::State& s) { oracle_case<float>(s, B::Mpfr, 0); }
void BM_Oracle_Double_Mpfr114_Fast(benchmark::State& s) { oracle_case<double>(s, B::Mpfr, 0); }
// The same with the statistical bound (OracleOptions::statistical) as well.
void BM_Oracle_Float_Mpfr114_Fast_Statistical(benchmark::State& s) { oracle_case<float>(s, B::Mpfr, 0, true); }
void BM_Oracle_Float_CppBinFloat113_Fast(benchmark::State& s) { oracle_case<float>(s, B::CppBinFloat, 0); }
void BM_Oracle_Double_CppBinFloat113_Fast(benchmark::State& s) { oracle_case<double>(s, B::CppBinFloat, 0); }
// The plain multiprecision path (every operation in Real), 114 and 113 bits.
void BM_Oracle_Double_Mpfr114_Plain(benchmark::State& s) { oracle_case<double>(s, B::Mpfr, 114); }
void BM_Oracle_Double_CppBinFloat113_Plain(benchmark::State& s) { oracle_case<double>(s, B::CppBinFloat, 113); }

}  // namespace

BENCHMARK(BM_Oracle_Float_Mpfr114_Fast)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Oracle_Double_Mpfr114_Fast)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Oracle_Float_Mpfr114_Fast_Statistical)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Oracle_Float_CppBinFloat113_Fast)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Oracle_Double_CppBinFloat113_Fast)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Oracle_Double_Mpfr114_Plain)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Oracle_Double_CppBinFloat113_Plain)->Arg(16)->Arg(64)->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
