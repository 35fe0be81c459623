// Attention speed on one machine, in one run: BLIS gemm (the limit), naive BLIS attention, `reference`, `tiled`;
// plus a peak-memory probe (`--memory-probe IMPL T`), run by `attn bench` in separate processes.
//
// Benchmark names are config strings (attn/suite/config.hpp):
// "sdpa(B=1,H=8,Tq=4096,Tk=4096,Dk=64,Dv=64,mask=none,dtype=float,threads=1,impl=tiled)".
// FLOPs per attention = 4 B H D per visible (query, key) pair: Tq Tk without a positional rule, about half of it
// causal, the band of a sliding window; so every row's GFLOP/s is the rate on the work its mask leaves and compares
// with the gemm's (2 M N K) directly, never above the limit because pairs were skipped.
// float16 and bfloat16 rows: the tiled kernel on 16-bit storage (float32 arithmetic), against the float gemm.
// Library rows write into one preallocated output (scaled_dot_product_attention_into), as the gemm does.
// Backward rows (op "backward"): attn::sdpa_backward after one untimed forward that saved the output and lse, FLOPs
// 2.5x the forward's (10 B H Tq Tk D, as FlashAttention counts: five products of the forward's size, two of them
// the forward's own).
// Own flags (before Google Benchmark's): --quick (fewer shapes), --reps N, --gemm-configs A,B (gemm rows with those
// BLIS configurations too, impl=blis-A), --memory-probe IMPL T [DTYPE].
#include <benchmark/benchmark.h>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "attn/attn.hpp"
#include "attn/machine.hpp"
#include "attn/suite/config.hpp"
#include "gemm.hpp"

namespace {

using attn::Index;

constexpr Index B = 1, H = 8, D = 64;
// The gemm limit: a square product large enough for BLIS's blocking to reach its steady state (on the 2-core
// Zen4 VM, warmed up: 1024 -> 101-103 GFLOP/s, 1536-2560 -> 103-106, so 2048 rather than the slightly slower 1024).
constexpr Index gemm_size = 2048;

template <class T>
attn::Tensor<T> random_tensor(const attn::Shape& shape, unsigned seed) {
    attn::Tensor<T> t(shape);
    std::mt19937 gen(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (Index i = 0; i < t.numel(); ++i) t[i] = static_cast<T>(normal(gen));
    return t;
}

// `threads` independent single-threaded gemms at once: the machine's limit for work split the way attention
// splits it (no shared packing, no BLIS threading). With the library's gemm configuration, or `configuration`'s.
template <class T>
void bench_gemm(benchmark::State& state, int threads, const std::string& configuration) {
    const Index n = gemm_size;
    std::vector<attn::Tensor<T>> a, b, c;
    for (int t = 0; t < threads; ++t) {
        a.push_back(random_tensor<T>({n, n}, 10 + t));
        b.push_back(random_tensor<T>({n, n}, 20 + t));
        c.emplace_back(attn::Shape{n, n});
    }
    const auto run = [&] {
#pragma omp parallel for num_threads(threads) schedule(static)
        for (int t = 0; t < threads; ++t)
            if (configuration == "packed")  // the library's packed products (the measured limit's "packed" row)
                attn::detail::packed_blocked_gemm<T>(n, n, n, a[t].data(), b[t].data(), c[t].data());
            else
                attn::detail::gemm<T>(false, false, n, n, n, T(1), a[t].data(), n, 1, b[t].data(), n, 1, T(0),
                                      c[t].data(), n, 1, configuration.empty() ? nullptr : configuration.c_str());
        benchmark::DoNotOptimize(c[0].data());
    };
    run();  // untimed: BLIS's packing buffers and the output pages are touched once before the limit is measured
    for (auto _ : state) run();
    state.counters["flop"] = 2.0 * double(n) * double(n) * double(n) * threads;
}

// Naive attention with BLIS: per (batch, head) s (Tq, Tk) = scale q k^T (gemm), causal mask, scalar std::exp row
// softmax, out (Tq, D) = s v (gemm). What one writes first; the Tq x Tk matrix lives in memory.
template <class T>
void naive_attention(const T* q, const T* k, const T* v, T* out, Index batch, Index Tq, Index Tk, bool causal,
                     int threads) {
    const T scale = T(1) / std::sqrt(T(D));
#pragma omp parallel num_threads(threads)
    {
        std::vector<T> s(static_cast<std::size_t>(Tq * Tk));
#pragma omp for schedule(static)
        for (Index b = 0; b < batch; ++b) {
            const T* qb = q + b * Tq * D;
            const T* kb = k + b * Tk * D;
            const T* vb = v + b * Tk * D;
            // s (Tq, Tk) = scale * q (Tq, D) @ k^T (D, Tk)
            attn::detail::gemm<T>(false, true, Tq, Tk, D, scale, qb, D, 1, kb, D, 1, T(0), s.data(), Tk, 1);
            for (Index i = 0; i < Tq; ++i) {
                T* row = s.data() + i * Tk;
                const Index end = causal ? std::min(Tk, i + 1 + Tk - Tq) : Tk;  // bottom-right alignment
                for (Index j = end; j < Tk; ++j) row[j] = -std::numeric_limits<T>::infinity();
                T m = -std::numeric_limits<T>::infinity();
                for (Index j = 0; j < Tk; ++j) m = std::max(m, row[j]);
                T sum = 0;
                for (Index j = 0; j < Tk; ++j) {
                    row[j] = std::exp(row[j] - m);
                    sum += row[j];
                }
                for (Index j = 0; j < Tk; ++j) row[j] /= sum;
            }
            // out (Tq, D) = s (Tq, Tk) @ v (Tk, D)
            attn::detail::gemm<T>(false, false, Tq, D, Tk, T(1), s.data(), Tk, 1, vb, D, 1, T(0), out + b * Tq * D, D,
                                  1);
        }
    }
}

// The variants a row may turn on (tiled float rows only).
struct Variant {
    std::optional<attn::SlidingWindow> window;
    double softcap = 0;
    // An explicit bias of normal values: (B, H, Tq, Tk), a float attn_mask per head (the suite's kind "normal"), or
    // with bias_matrix (Tq, Tk) for every head (kind "matrix", PyTorch's usual attn_mask).
    bool bias = false, bias_matrix = false;
    bool alibi = false;  // ALiBi with the standard slopes (H), attn::alibi_slopes
};

// The (query, key) pairs a row's positional rule leaves (causal bottom-right and the window, as the rows run).
double visible_pairs(Index Tq, Index Tk, bool causal, std::optional<attn::SlidingWindow> window) {
    const attn::PositionRule rule{causal, attn::CausalAlignment::BottomRight, window};
    double pairs = 0;
    for (Index i = 0; i < Tq; ++i) pairs += double(rule.keys(i, Tq, Tk).end - rule.keys(i, Tq, Tk).begin);
    return pairs;
}

template <class T>
void bench_attention(benchmark::State& state, const std::string& impl, Index Tq, Index Tk, bool causal, int threads,
                     const Variant& variant = {}) {
    const auto q = random_tensor<T>({B, H, Tq, D}, 1);
    const auto k = random_tensor<T>({B, H, Tk, D}, 2);
    const auto v = random_tensor<T>({B, H, Tk, D}, 3);
    const std::optional<attn::SlidingWindow> window = variant.window;
    const auto bias = variant.bias_matrix ? random_tensor<T>({Tq, Tk}, 4)
                      : variant.bias      ? random_tensor<T>({B, H, Tq, Tk}, 4)
                                          : attn::Tensor<T>({0});
    attn::Tensor<T> slopes({H});
    const std::vector<double> standard = attn::alibi_slopes(H);
    for (Index h = 0; h < H; ++h) slopes[h] = static_cast<T>(standard[static_cast<std::size_t>(h)]);
    attn::SdpaOptions options;
    if (variant.bias || variant.bias_matrix) options.bias = bias;
    if (variant.alibi) options.alibi_slopes = slopes;
    options.is_causal = causal;
    options.alignment = attn::CausalAlignment::BottomRight;  // Tq <= Tk here: every row has a key
    options.window = window;
    options.softcap = variant.softcap;
    options.num_threads = threads;
    options.backend = impl == "tiled" ? attn::Backend::Tiled : attn::Backend::Reference;
    // Every row writes into this one output, as the gemm writes into its C: a fresh output per call would add the
    // first touch of its pages, which on a 32 MB output costs about as much as a window's kernel.
    attn::Tensor<T> out({B, H, Tq, D});
    for (auto _ : state) {
        if constexpr (!attn::is_half_v<T>) {
            if (impl == "naive") {
                naive_attention<T>(q.data(), k.data(), v.data(), out.data(), B * H, Tq, Tk, causal, threads);
                benchmark::DoNotOptimize(out.data());
                continue;
            }
        }
        attn::scaled_dot_product_attention_into(out.view(), q.view(), k.view(), v.view(), std::nullopt, options);
        benchmark::DoNotOptimize(out.data());
    }
    state.counters["flop"] = 4.0 * double(B * H) * visible_pairs(Tq, Tk, causal, window) * double(D);
}

// The backward pass of the same call: dq, dk, dv from a dout of normal values.
template <class T>
void bench_backward(benchmark::State& state, const std::string& impl, Index T_len, bool causal, int threads) {
    const auto q = random_tensor<T>({B, H, T_len, D}, 1);
    const auto k = random_tensor<T>({B, H, T_len, D}, 2);
    const auto v = random_tensor<T>({B, H, T_len, D}, 3);
    const auto dout = random_tensor<T>({B, H, T_len, D}, 5);
    attn::SdpaOptions options;
    options.is_causal = causal;
    options.alignment = attn::CausalAlignment::BottomRight;
    options.num_threads = threads;
    options.backend = impl == "tiled" ? attn::Backend::Tiled : attn::Backend::Reference;
    options.return_lse = true;
    const attn::SdpaResult<T> f = attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    for (auto _ : state) {
        const attn::SdpaGradients<T> g = attn::sdpa_backward(q.view(), k.view(), v.view(), f.output.view(),
                                                             f.lse->view(), dout.view(), std::nullopt, options);
        benchmark::DoNotOptimize(g.dq.data());
    }
    state.counters["flop"] = 10.0 * double(B * H) * visible_pairs(T_len, T_len, causal, std::nullopt) * double(D);
}

void register_all(bool quick, int reps_override, const std::vector<std::string>& gemm_configurations) {
    const std::vector<Index> Ts =
        quick ? std::vector<Index>{512, 2048} : std::vector<Index>{128, 512, 1024, 2048, 4096};
    struct Shape {
        Index Tq, Tk;
        bool causal;
        Variant variant = {};  // tiled float rows only, but for the window's (all tiled rows: the others compute Tq Tk)
    };
    std::vector<Shape> shapes;
    for (Index T : Ts) shapes.push_back({T, T, false});  // self
    for (Index T : Ts) shapes.push_back({T, T, true});   // causal
    if (!quick) shapes.push_back({128, 4096, false});    // cross
    // FlashAttention's local attention (window_size = (256, 0)): at T = 4096 next to the rows above, and at 16384,
    // where a window's cost (T w) is 1/64 of full attention's (T^2).
    for (Index T : quick ? std::vector<Index>{2048} : std::vector<Index>{4096, 16384})
        shapes.push_back({T, T, false, Variant{attn::SlidingWindow{256, 0}}});
    // Gemma 2's attention-logit cap, 50, an explicit bias per head and ALiBi, each next to the plain self-attention
    // row of the same size (their cost is the tanh, the bias's reads and additions).
    shapes.push_back({Ts.back(), Ts.back(), false, Variant{std::nullopt, 50.0}});
    shapes.push_back({Ts.back(), Ts.back(), false, Variant{std::nullopt, 0, true}});
    shapes.push_back({Ts.back(), Ts.back(), false, Variant{std::nullopt, 0, false, false, true}});  // ALiBi
    shapes.push_back({Ts.back(), Ts.back(), false, Variant{std::nullopt, 0, false, true}});         // (Tq, Tk)
    const double min_time = quick ? 0.05 : 0.2;
    const int reps = reps_override > 0 ? reps_override : quick ? 3 : 5;
    for (int threads : {1, 2}) {
        const auto add_dtype = [&]<class T>(T) {
            // Every row is named by its config string (attn/suite/config.hpp); the gemm limit is the op "gemm", one
            // (Tq x Dk) x (Dk x Tk) product of gemm_size cubed. 16-bit storage computes in float: its limit is the
            // float gemm, and it has tiled rows only (the fast path whose target is a fraction of sgemm).
            constexpr bool sixteen_bit = attn::is_half_v<T>;
            attn::suite::CaseConfig config;
            config.dtype = attn::suite::dtype_of<T>();
            config.threads = threads;
            attn::suite::CaseConfig gemm = config;
            gemm.op = "gemm";
            gemm.Tq = gemm.Tk = gemm.Dk = gemm.Dv = gemm_size;
            gemm.impl = "blis";
            // The limit's candidates beside the library's own (impl=blis): impl=blis-<configuration> for the others
            // --gemm-configs names (attn bench: the measured limit's fastest and BLIS's own pick).
            if constexpr (!sixteen_bit)
                for (const std::string& configuration : gemm_configurations) {
                    attn::suite::CaseConfig named = gemm;
                    if (!configuration.empty()) named.impl = "blis-" + configuration;
                    benchmark::RegisterBenchmark(named.to_config().c_str(), [threads, configuration](benchmark::State& s) {
                        bench_gemm<T>(s, threads, configuration);
                    })->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(min_time)->Repetitions(reps);
                }
            const std::vector<const char*> impls =
                sixteen_bit ? std::vector<const char*>{"tiled"} : std::vector<const char*>{"naive", "reference", "tiled"};
            for (const Shape& sh : shapes)
                for (const char* impl : impls) {
                    const Variant& var = sh.variant;
                    const bool variant = var.window || var.softcap != 0 || var.bias || var.bias_matrix || var.alibi;
                    if (variant && (std::string(impl) != "tiled" || !std::is_same_v<T, float>)) continue;
                    attn::suite::CaseConfig row = config;
                    row.B = B, row.H = row.kv_heads = H, row.Tq = sh.Tq, row.Tk = sh.Tk, row.Dk = row.Dv = D;
                    row.mask = sh.causal ? "causal-br" : var.window ? "window" : "none";
                    row.window = var.window;
                    if (var.softcap != 0) row.softcap = var.softcap;
                    if (var.bias) row.bias = "normal";  // the suite's kind of a (B, H, Tq, Tk) bias
                    if (var.bias_matrix) row.bias = "matrix";
                    if (var.alibi) row.alibi = "heads";
                    row.impl = impl;
                    const std::string name = row.to_config();
                    const std::string which = impl;
                    benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
                        bench_attention<T>(s, which, sh.Tq, sh.Tk, sh.causal, threads, sh.variant);
                    })->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(min_time)->Repetitions(reps);
                }
        };
        add_dtype(float{});
        add_dtype(double{});
        add_dtype(attn::float16{});
        add_dtype(attn::bfloat16{});
        // The backward pass, float: both backends at the target's size, self and causal.
        for (bool causal : {false, true})
            for (const char* impl : {"reference", "tiled"}) {
                attn::suite::CaseConfig row;
                row.op = "backward";
                row.dtype = attn::suite::dtype_of<float>();
                row.threads = threads;
                row.B = B, row.H = row.kv_heads = H, row.Tq = row.Tk = Ts.back(), row.Dk = row.Dv = D;
                row.mask = causal ? "causal-br" : "none";
                row.impl = impl;
                const std::string name = row.to_config();
                const std::string which = impl;
                const Index T_len = Ts.back();
                benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& s) {
                    bench_backward<float>(s, which, T_len, causal, threads);
                })->UseRealTime()->Unit(benchmark::kMillisecond)->MinTime(min_time)->Repetitions(reps);
            }
    }
}

long peak_rss_kib() {
    rusage usage{};
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_maxrss;
}

// A memory probe's one JSON line (KiB): what the inputs added, the peak before and after the call, the outputs' size,
// and the peak beyond all of them.
template <class T>
void print_probe(const std::string& impl, Index T_len, long inputs, long before, long after, long output_kib) {
    std::printf("{\"impl\": \"%s\", \"dtype\": \"%s\", \"T\": %ld, \"H\": 1, \"D\": %ld, \"inputs_kib\": %ld, "
                "\"baseline_kib\": %ld, \"peak_kib\": %ld, \"output_kib\": %ld, \"beyond_inputs_and_output_kib\": %ld}\n",
                impl.c_str(), attn::suite::to_string(attn::suite::dtype_of<T>()), static_cast<long>(T_len),
                static_cast<long>(D), inputs, before, after, output_kib, after - before - output_kib);
}

// One SDPA call (H=1, D=64, self-attention, 1 thread) in this process on storage T. Prints, in KiB: the peak
// resident memory the inputs added (measured: allocated and touched), the peak beyond what the process held with
// its inputs, less the output, and the output's size.
template <class T>
int memory_probe(const std::string& impl, Index T_len) {
    attn::SdpaOptions options;
    options.num_threads = 1;
    if (impl == "tiled") options.backend = attn::Backend::Tiled;
    else if (impl == "reference") options.backend = attn::Backend::Reference;
    else {
        std::fprintf(stderr, "memory probe: impl must be tiled or reference, got %s\n", impl.c_str());
        return 2;
    }
    // Warm up the allocator and the generator first, so the inputs' figure is their pages alone.
    { const auto warm_up = random_tensor<T>({1, 1, 64, D}, 0); }
    const long empty = peak_rss_kib();
    const auto q = random_tensor<T>({1, 1, T_len, D}, 1);
    const auto k = random_tensor<T>({1, 1, T_len, D}, 2);
    const auto v = random_tensor<T>({1, 1, T_len, D}, 3);
    const long before = peak_rss_kib();
    const auto r = attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    const long after = peak_rss_kib();
    const long output_kib = static_cast<long>(r.output.numel() * static_cast<Index>(sizeof(T)) / 1024);
    print_probe<T>(impl, T_len, before - empty, before, after, output_kib);
    return 0;
}

// The backward of one such call (impl "tiled-backward" or "reference-backward"): the forward (its output and lse),
// dout and the inputs count as the inputs; beyond them, the peak less the three gradients.
template <class T>
int backward_memory_probe(const std::string& impl, Index T_len) {
    attn::SdpaOptions options;
    options.num_threads = 1;
    options.backend = impl == "tiled-backward" ? attn::Backend::Tiled : attn::Backend::Reference;
    options.return_lse = true;
    { const auto warm_up = random_tensor<T>({1, 1, 64, D}, 0); }
    const long empty = peak_rss_kib();
    const auto q = random_tensor<T>({1, 1, T_len, D}, 1);
    const auto k = random_tensor<T>({1, 1, T_len, D}, 2);
    const auto v = random_tensor<T>({1, 1, T_len, D}, 3);
    const auto dout = random_tensor<T>({1, 1, T_len, D}, 5);
    const auto f = attn::scaled_dot_product_attention(q.view(), k.view(), v.view(), std::nullopt, options);
    const long before = peak_rss_kib();
    const auto g = attn::sdpa_backward(q.view(), k.view(), v.view(), f.output.view(), f.lse->view(), dout.view(),
                                       std::nullopt, options);
    const long after = peak_rss_kib();
    const long grads_kib = static_cast<long>(3 * g.dq.numel() * static_cast<Index>(sizeof(T)) / 1024);
    print_probe<T>(impl, T_len, before - empty, before, after, grads_kib);
    return 0;
}

int memory_probe(const std::string& impl, Index T_len, const std::string& dtype) {
    if (impl == "tiled-backward" || impl == "reference-backward") {
        if (dtype == "float") return backward_memory_probe<float>(impl, T_len);
        std::fprintf(stderr, "memory probe: the backward's is float only, got %s\n", dtype.c_str());
        return 2;
    }
    if (dtype == "float") return memory_probe<float>(impl, T_len);
    if (dtype == "bfloat16") return memory_probe<attn::bfloat16>(impl, T_len);
    if (dtype == "float16") return memory_probe<attn::float16>(impl, T_len);
    std::fprintf(stderr, "memory probe: dtype must be float, float16 or bfloat16, got %s\n", dtype.c_str());
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    if ((argc == 4 || argc == 5) && std::strcmp(argv[1], "--memory-probe") == 0)
        return memory_probe(argv[2], std::atol(argv[3]), argc == 5 ? argv[4] : "float");
    bool quick = false;
    int reps = 0;
    std::vector<std::string> gemm_configurations = {""};  // "": the library's gemm configuration
    std::vector<char*> args{argv[0]};
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--quick") == 0) quick = true;
        else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::atoi(argv[++i]);
        else if (std::strcmp(argv[i], "--gemm-configs") == 0 && i + 1 < argc) {
            std::string list = argv[++i];
            for (std::size_t at = 0; at <= list.size();) {
                const std::size_t comma = std::min(list.find(',', at), list.size());
                if (comma > at) gemm_configurations.push_back(list.substr(at, comma - at));
                at = comma + 1;
            }
        }
        else args.push_back(argv[i]);
    }
    int n = static_cast<int>(args.size());
    benchmark::Initialize(&n, args.data());
    if (benchmark::ReportUnrecognizedArguments(n, args.data())) return 2;
    register_all(quick, reps, gemm_configurations);
    // The machine in the JSON's context: the SIMD target the tiled kernel dispatches to and the BLIS kernels decide
    // the speed as well as the bits, so figures compare only between runs of the same fingerprint.
    const attn::NumericsFingerprint fingerprint = attn::numerics_fingerprint();
    benchmark::AddCustomContext("attn_fingerprint", fingerprint.id());
    for (const auto& [name, value] : fingerprint.fields()) benchmark::AddCustomContext("attn_" + name, value);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}
