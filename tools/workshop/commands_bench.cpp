// `attn bench`: runs the attention benchmark (gemm limit, naive BLIS attention, reference, tiled) in one process,
// then the peak-memory probes in separate processes, and prints the table and the targets.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <tuple>
#include <unistd.h>
#include <vector>

#include <nlohmann/json.hpp>

#include "attn/suite/config.hpp"
#include "commands.hpp"

namespace attn::cli {

#ifdef ATTN_BENCH_BINARY
namespace {

using nlohmann::json;

struct Row {
    std::string config, impl, dtype, kase;
    int threads = 0;
    long Tq = 0, Tk = 0, D = 0;
    double flop = 0;
    std::vector<double> ms;      // wall time, one per repetition
    std::vector<double> cpu_ms;  // CPU time of the calling thread: on a shared machine, what 1-thread rows got
    static double median_of(std::vector<double> s) {
        std::sort(s.begin(), s.end());
        const std::size_t n = s.size();
        return n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
    }
    double median() const { return median_of(ms); }
    double cpu_median() const { return median_of(cpu_ms); }
    double min() const { return *std::min_element(ms.begin(), ms.end()); }
    double max() const { return *std::max_element(ms.begin(), ms.end()); }
    double gflops() const { return flop / (median() * 1e-3) / 1e9; }
};

// "sdpa(B=1,H=8,Tq=4096,Tk=4096,Dk=64,Dv=64,mask=none,dtype=float,threads=1,impl=tiled)/min_time:0.200/repeats:5"
// (a config string, attn/suite/config.hpp, then Google Benchmark's suffixes) -> fields. The gemm rows are
// "gemm(...,impl=blis)" (the library's gemm configuration) and "gemm(...,impl=blis-zen3)" (another BLIS
// configuration): impl "gemm" and "gemm-zen3" here; the fastest of them is the row's limit.
Row parse_name(const std::string& run_name) {
    const suite::CaseConfig c = suite::parse_config(run_name.substr(0, run_name.find('/')));
    Row r;
    r.config = c.to_config();
    r.impl = c.op != "gemm" ? c.impl : c.impl == "blis" ? "gemm" : "gemm-" + c.impl.substr(c.impl.find('-') + 1);
    r.dtype = suite::to_string(c.dtype);
    r.threads = c.threads;
    r.kase = c.op == "gemm"            ? "gemm"
             : c.op == "backward"    ? (c.mask == "causal-br" ? "backward-causal" : "backward")
             : c.mask == "causal-br" ? "causal"
             : c.window              ? "window"  // GFLOP/s counted on the visible pairs (bench/attention_bench.cpp)
             : c.softcap             ? "softcap"
             : c.bias == "matrix"    ? "bias2d"  // (Tq, Tk) for every head
             : c.bias != "none"      ? "bias4d"  // (B, H, Tq, Tk)
             : c.alibi != "none"     ? "alibi"
             : c.Tq == c.Tk          ? "self"
                                     : "cross";
    r.Tq = static_cast<long>(c.Tq), r.Tk = static_cast<long>(c.Tk), r.D = static_cast<long>(c.Dk);
    return r;
}

std::string capture(const std::string& command) {
    std::string out;
    if (FILE* f = popen(command.c_str(), "r")) {
        char buf[512];
        while (std::fgets(buf, sizeof buf, f)) out += buf;
        pclose(f);
    }
    return out;
}

// Every repetition of every benchmark, by run name, in registration order; the gemm limit and naive rows by key.
struct Measured {
    std::map<std::string, Row> by_name;
    std::vector<std::string> order;
    // The limit, (dtype, threads): the fastest gemm row of this run.
    std::map<std::tuple<std::string, int>, double> gemm_gflops;
    std::map<std::tuple<std::string, int>, double> gemm_cpu_ms;  // ms per flop, the fastest on CPU time
    std::map<std::tuple<std::string, int, std::string, long, long>, double> naive_ms;
};

// --filter selects by config fields (suite::config_matches); Google Benchmark gets the exact names as a regex
// ("" when there is no filter; nullopt when nothing matches).
std::optional<std::string> names_regex(const std::string& program, const std::string& filter) {
    if (filter.empty()) return std::string();
    std::string regex;
    std::stringstream listed(capture(program + " --benchmark_list_tests=true"));
    std::string name;
    while (std::getline(listed, name)) {
        name = name.substr(0, name.find('/'));
        if (name.empty()) continue;
        // The limit's other gemm rows (impl=blis-<configuration>) go with the library's (impl=blis).
        suite::CaseConfig as_limit = suite::parse_config(name);
        if (as_limit.op == "gemm") as_limit.impl = "blis";
        if (!suite::config_matches(as_limit.to_config(), filter)) continue;  // every benchmark is listed once
        std::string escaped;
        for (char ch : name) escaped += std::string(std::strchr("()[]{}.+*?^$|\\", ch) ? "\\" : "") + ch;
        regex += (regex.empty() ? "" : "|") + escaped;
    }
    if (regex.empty()) return std::nullopt;
    return "^(" + regex + ")/";
}

Measured collect(const json& raw_json) {
    Measured m;
    auto& by_name = m.by_name;
    auto& order = m.order;
    // Repetitions of one benchmark share its run_name.
    std::map<std::string, long> family;  // registration order: the table's order under random interleaving
    for (const json& b : raw_json["benchmarks"]) {
        if (b.value("run_type", "") != "iteration") continue;
        const std::string name = b["run_name"];
        if (!by_name.count(name)) {
            by_name[name] = parse_name(name);
            by_name[name].flop = b["flop"].get<double>();
            family[name] = b.value("family_index", 0L);
            order.push_back(name);
        }
        by_name[name].ms.push_back(b["real_time"].get<double>());  // Unit(kMillisecond)
        by_name[name].cpu_ms.push_back(b["cpu_time"].get<double>());
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](const std::string& a, const std::string& b) { return family[a] < family[b]; });
    for (const auto& [name, r] : by_name) {
        if (r.impl.rfind("gemm", 0) == 0) {
            const std::tuple<std::string, int> key{r.dtype, r.threads};
            m.gemm_gflops[key] = std::max(m.gemm_gflops[key], r.gflops());
            const double per_flop = r.cpu_median() / r.flop;
            if (!m.gemm_cpu_ms.count(key) || per_flop < m.gemm_cpu_ms[key]) m.gemm_cpu_ms[key] = per_flop;
        }
        if (r.impl == "naive") m.naive_ms[{r.dtype, r.threads, r.kase, r.Tq, r.Tk}] = r.median();
    }

    return m;
}

// The dtype whose gemm is a row's limit: 16-bit storage computes in float.
std::string limit_dtype(const std::string& dtype) {
    return dtype == "float16" || dtype == "bfloat16" ? "float" : dtype;
}

// The table, one line per benchmark; its rows as JSON.
json print_rows(Measured& m) {
    json rows = json::array();
    std::printf("\n%-12s %-6s %2s %-6s %5s %5s %4s %10s %19s %8s %8s %8s %10s %11s\n", "impl", "dtype", "th", "case",
                "Tq", "Tk", "D", "ms", "[min, max]", "GFLOP/s", "% limit", "x naive", "cpu ms", "% limit cpu");
    for (const std::string& name : m.order) {
        const Row& r = m.by_name[name];
        // Ratios to the gemm limit only when its row ran (--filter may leave it out): "-" and null otherwise.
        const auto gemm = m.gemm_gflops.find({limit_dtype(r.dtype), r.threads});
        const auto gemm_cpu = m.gemm_cpu_ms.find({limit_dtype(r.dtype), r.threads});
        const bool have_gemm = gemm != m.gemm_gflops.end() && gemm_cpu != m.gemm_cpu_ms.end();
        const double pct = have_gemm ? 100.0 * r.gflops() / gemm->second : 0.0;
        // Same ratio on the calling thread's CPU time: immune to other processes on 1-thread rows.
        const double pct_cpu = have_gemm ? 100.0 * gemm_cpu->second / (r.cpu_median() / r.flop) : 0.0;
        const auto naive = m.naive_ms.find({r.dtype, r.threads, r.kase, r.Tq, r.Tk});
        const double speedup = naive != m.naive_ms.end() ? naive->second / r.median() : 0.0;
        std::printf("%-12s %-6s %2d %-6s %5ld %5ld %4ld %10.2f [%8.2f, %8.2f] %8.1f ", r.impl.c_str(), r.dtype.c_str(),
                    r.threads, r.kase.c_str(), r.Tq, r.Tk, r.D, r.median(), r.min(), r.max(), r.gflops());
        if (have_gemm) std::printf("%7.1f%% ", pct);
        else std::printf("%8s ", "-");
        if (speedup > 0) std::printf("%7.2fx ", speedup);
        else std::printf("%8s ", "-");
        if (have_gemm) std::printf("%10.2f %10.1f%%\n", r.cpu_median(), pct_cpu);
        else std::printf("%10.2f %11s\n", r.cpu_median(), "-");
        rows.push_back({{"config", r.config}, {"impl", r.impl}, {"dtype", r.dtype}, {"threads", r.threads}, {"case", r.kase},
                        {"Tq", r.Tq}, {"Tk", r.Tk}, {"D", r.D}, {"ms", r.median()}, {"ms_min", r.min()},
                        {"ms_max", r.max()}, {"repetitions", r.ms.size()}, {"gflops", r.gflops()},
                        {"pct_of_gemm", have_gemm ? json(pct) : json(nullptr)}, {"speedup_over_naive", speedup},
                        {"cpu_ms", r.cpu_median()}, {"pct_of_gemm_cpu", have_gemm ? json(pct_cpu) : json(nullptr)}});
    }

    return rows;
}

// Peak resident memory, one process per measurement (so no allocation of one run hides in another's peak).
struct MemoryFigures {
    double tiled_32k = -1;  // tiled float at T=32768, MiB beyond inputs and output (-1: not measured)
    double backward_32k = -1;  // the tiled backward at T=32768, MiB beyond inputs, saved forward, dout and gradients
    // Inputs' measured resident memory per dtype at the 16-bit probe's T, KiB (absent: not measured).
    std::map<std::string, double> inputs_kib;
};

json measure_memory(const std::string& binary, bool quick, MemoryFigures* figures) {
    json memory = json::array();
    std::printf("\npeak memory (H=1, D=64, self, 1 thread, separate processes; MiB)\n");
    std::printf("%-14s %-8s %6s %8s %16s\n", "impl", "dtype", "T", "inputs", "beyond in + out");
    const std::vector<long> Ts = quick ? std::vector<long>{4096} : std::vector<long>{4096, 16384, 32768};
    const long half_T = quick ? 4096 : 16384;  // the 16-bit probes: tiled only
    std::vector<std::tuple<std::string, std::string, long>> probes;
    for (long T : Ts)
        for (const char* impl : {"reference", "tiled"}) probes.emplace_back(impl, "float", T);
    for (const char* dtype : {"bfloat16", "float16"}) probes.emplace_back("tiled", dtype, half_T);
    // The backward: inputs = q, k, v, dout and the saved output and lse; out = the three gradients.
    probes.emplace_back("tiled-backward", "float", quick ? 4096 : 32768);
    for (const auto& [impl, dtype, T] : probes) {
        const std::string out =
            capture("'" + binary + "' --memory-probe " + impl + " " + std::to_string(T) + " " + dtype);
        try {
            const json m = json::parse(out);
            const double inputs = m["inputs_kib"].get<double>();
            const double mib = m["beyond_inputs_and_output_kib"].get<double>() / 1024.0;
            std::printf("%-14s %-8s %6ld %8.1f %16.1f\n", impl.c_str(), dtype.c_str(), T, inputs / 1024.0, mib);
            memory.push_back(m);
            if (T == 32768 && impl == "tiled" && dtype == "float") figures->tiled_32k = mib;
            if (T == 32768 && impl == "tiled-backward") figures->backward_32k = mib;
            if (T == half_T && impl == "tiled") figures->inputs_kib[dtype] = inputs;
        } catch (const json::exception&) {
            std::printf("%-14s %-8s %6ld %8s\n", impl.c_str(), dtype.c_str(), T, "failed");
        }
    }

    return memory;
}

// The peer of the tiled rows: PyTorch's CPU SDPA forward and its autograd backward (math path) at the rows' size
// (bench/torch_peer.py, Debian's python3-torch), run after them in this run. Milliseconds, -1 without torch.
struct TorchPeer {
    double forward_ms = -1, backward_ms = -1;
};
TorchPeer measure_torch(long T, json* out) {
    const std::string script = std::string(ATTN_SOURCE_DIR) + "/bench/torch_peer.py";
    const std::string line = capture("/usr/bin/python3 '" + script + "' " + std::to_string(T) + " 2>/dev/null");
    TorchPeer peer;
    try {
        const json m = json::parse(line);
        *out = m;
        if (!m.contains("forward_ms") || !m.contains("backward_ms")) return peer;
        peer.forward_ms = m["forward_ms"].get<double>();
        peer.backward_ms = m["backward_ms"].get<double>();
        std::printf("\nPyTorch %s, T=%ld, float, 1 thread: SDPA forward %.1f ms, autograd backward (CPU math path) "
                    "%.1f ms\n", m.value("torch", "?").c_str(), T, peer.forward_ms, peer.backward_ms);
    } catch (const json::exception&) {
    }
    return peer;
}

// The targets of the fast path, from this run's rows.
void print_targets(Measured& m, bool quick, const MemoryFigures& memory, const TorchPeer& torch) {
    const double torch_backward_ms = torch.backward_ms;
    const double tiled_32k = memory.tiled_32k;
    auto& gemm_gflops = m.gemm_gflops;
    auto& gemm_cpu_ms = m.gemm_cpu_ms;
    // The targets of the fast path, from this run's rows.
    const auto find = [&](const std::string& impl, const std::string& dtype, int threads, const std::string& kase,
                          long T) -> const Row* {
        for (const auto& [name, r] : m.by_name)
            if (r.impl == impl && r.dtype == dtype && r.threads == threads && r.kase == kase && r.Tq == T &&
                r.Tk == T)
                return &r;
        return nullptr;
    };
    const long T = quick ? 2048 : 4096;
    std::printf("\ntargets (T=%ld self unless noted)\n", T);
    // A percentage of the limit above 100 is never met: the limit would be wrong (a faster gemm exists).
    const auto target = [](const char* what, bool have, double value, double goal, bool at_least,
                           const char* unit) {
        if (!have) {
            std::printf("  %-52s %s\n", what, "n/a");
            return;
        }
        const bool above_limit = std::strcmp(unit, "%") == 0 && value > 100;
        const bool ok = !above_limit && (at_least ? value >= goal : value <= goal);
        std::printf("  %-52s %8.2f%s (goal %s %.2f%s) %s\n", what, value, unit, at_least ? ">=" : "<=", goal, unit,
                    above_limit ? "ABOVE THE LIMIT (not met: the limit is wrong)" : ok ? "met" : "MISSED");
    };
    const Row* f1 = find("tiled", "float", 1, "self", T);
    const Row* f2 = find("tiled", "float", 2, "self", T);
    const Row* c1 = find("tiled", "float", 1, "causal", T);
    const Row* d1 = find("tiled", "double", 1, "self", T);
    // The gemm limit of this run (a --filter may have left it out: then no ratio to it).
    const auto has_gemm = [&](const char* dtype) {
        const auto it = gemm_gflops.find({dtype, 1});
        return it != gemm_gflops.end() && it->second > 0;
    };
    const bool sgemm = has_gemm("float"), dgemm = has_gemm("double");
    target("tiled float 1 thread, % of the sgemm limit", f1 && sgemm,
           f1 && sgemm ? 100 * f1->gflops() / gemm_gflops[{"float", 1}] : 0, 80, true, "%");
    target("tiled float 2 threads / 1 thread throughput", f1 && f2, f1 && f2 ? f1->median() / f2->median() : 0, 1.9,
           true, "x");
    target("tiled float causal / self time, 1 thread", f1 && c1, f1 && c1 ? c1->median() / f1->median() : 0, 0.55,
           false, "x");
    target("tiled double 1 thread, % of the dgemm limit", d1 && dgemm,
           d1 && dgemm ? 100 * d1->gflops() / gemm_gflops[{"double", 1}] : 0, 75, true, "%");
    target("PyTorch SDPA / tiled float time, 1 thread", f1 && torch.forward_ms > 0,
           f1 && torch.forward_ms > 0 ? torch.forward_ms / f1->median() : 0, 4, true, "x");
    for (const char* half : {"bfloat16", "float16"}) {
        const Row* h1 = find("tiled", half, 1, "self", T);
        const std::string what = std::string("tiled ") + half + " 1 thread, % of the sgemm limit";
        target(what.c_str(), h1 && sgemm, h1 && sgemm ? 100 * h1->gflops() / gemm_gflops[{"float", 1}] : 0, 75, true,
               "%");
    }
    // FlashAttention's local attention, window (256, 0), at T = 16384: the rate on the pairs the window leaves.
    const Row* w1 = find("tiled", "float", 1, "window", quick ? 2048 : 16384);
    target(quick ? "tiled float window (256, 0) T=2048, % of limit, visible pairs"
                 : "tiled float window (256, 0) T=16384, % of limit, visible pairs",
           w1 && sgemm, w1 && sgemm ? 100 * w1->gflops() / gemm_gflops[{"float", 1}] : 0, 70, true, "%");
    // Soft-capping (Gemma 2's cap of 50) against plain self-attention of the same size: the cost of the tanh.
    const Row* s1 = find("tiled", "float", 1, "softcap", T);
    target("tiled float softcap / plain time, 1 thread", f1 && s1, f1 && s1 ? s1->median() / f1->median() : 0, 1.15,
           false, "x");
    // An explicit bias, (Tq, Tk) for every head or (B, H, Tq, Tk), and ALiBi, the same way: the cost of reading and
    // adding the bias.
    const Row* b2 = find("tiled", "float", 1, "bias2d", T);
    target("tiled float bias (Tq, Tk) / plain time, 1 thread", f1 && b2, f1 && b2 ? b2->median() / f1->median() : 0,
           1.15, false, "x");
    const Row* b1 = find("tiled", "float", 1, "bias4d", T);
    target("tiled float bias (B, H, Tq, Tk) / plain time, 1 thread", f1 && b1,
           f1 && b1 ? b1->median() / f1->median() : 0, 1.15, false, "x");
    const Row* a1 = find("tiled", "float", 1, "alibi", T);
    target("tiled float ALiBi / plain time, 1 thread", f1 && a1, f1 && a1 ? a1->median() / f1->median() : 0, 1.15,
           false, "x");
    target("tiled memory at T=32768 beyond inputs and output", tiled_32k >= 0, tiled_32k, 64, false, " MiB");
    // The backward pass (FLOPs 2.5x the forward's): against the same sgemm, on 2 threads, causal against self.
    const Row* g1 = find("tiled", "float", 1, "backward", T);
    const Row* g2 = find("tiled", "float", 2, "backward", T);
    const Row* gc = find("tiled", "float", 1, "backward-causal", T);
    target("tiled float backward 1 thread, % of the sgemm limit", g1 && sgemm,
           g1 && sgemm ? 100 * g1->gflops() / gemm_gflops[{"float", 1}] : 0, 60, true, "%");
    target("tiled float backward 2 threads / 1 thread throughput", g1 && g2, g1 && g2 ? g1->median() / g2->median() : 0,
           1.9, true, "x");
    target("tiled float backward causal / self time, 1 thread", g1 && gc, g1 && gc ? gc->median() / g1->median() : 0,
           0.55, false, "x");
    target("PyTorch autograd / tiled float backward time, 1 thread", g1 && torch_backward_ms > 0,
           g1 && torch_backward_ms > 0 ? torch_backward_ms / g1->median() : 0, 4, true, "x");
    target("tiled backward memory at T=32768 beyond in + out", memory.backward_32k >= 0, memory.backward_32k, 128,
           false, " MiB");
    // Half the input memory of float, as measured (resident pages): each of the three inputs may hold one page
    // (4 KiB) more than its bytes, which is the slack over one half.
    const auto inputs = [&](const char* dtype) {
        const auto it = memory.inputs_kib.find(dtype);
        return it == memory.inputs_kib.end() ? -1.0 : it->second;
    };
    for (const char* half : {"bfloat16", "float16"}) {
        const double h = inputs(half), f = inputs("float");
        const std::string what = std::string("tiled ") + half + " inputs / float inputs, memory";
        target(what.c_str(), h > 0 && f > 0, h > 0 && f > 0 ? h / f : 0, f > 0 ? 0.5 + 3 * 4 / f : 0.5, false, "x");
    }
    // The 1-thread ratios again on CPU time, for runs on a machine other processes share.
    const auto pct_cpu = [&](const Row* r, const char* dtype) {
        return 100.0 * gemm_cpu_ms[{dtype, 1}] / (r->cpu_median() / r->flop);
    };
    target("(cpu time) tiled float 1 thread, % of the sgemm limit", f1 && sgemm, f1 && sgemm ? pct_cpu(f1, "float") : 0,
           80, true, "%");
    target("(cpu time) tiled float causal / self, 1 thread", f1 && c1,
           f1 && c1 ? c1->cpu_median() / f1->cpu_median() : 0, 0.55, false, "x");
    target("(cpu time) tiled double 1 thread, % of the dgemm limit", d1 && dgemm,
           d1 && dgemm ? pct_cpu(d1, "double") : 0, 75, true, "%");

}

}  // namespace
#endif

Action add_bench_command(CLI::App& app) {
    auto* bench =
        app.add_subcommand("bench", "Speed of tiled vs reference vs naive BLIS attention vs gemm, and memory");
    static bool quick = false;
    static std::string json_path, filter;
    static int repetitions = 0;
    bench->add_flag("--quick", quick, "Fewer shapes and repetitions (a smoke run, not for figures)");
    bench->add_option("--json", json_path, "Also write the rows as JSON to this file");
    bench->add_option("--filter", filter,
                      "Only the rows whose config string has these fields (e.g. 'impl=tiled,threads=1'; the gemm "
                      "limit is impl=blis; alternatives separated by '|': 'impl=blis|mask=window'), as attn report "
                      "--filter");
    bench->add_option("--repetitions", repetitions, "Repetitions per benchmark (default 5, quick 3)");
    return [bench]() -> int {
        if (!bench->parsed()) return not_mine;
#ifndef ATTN_BENCH_BINARY
        std::cerr << "attn bench: this build has no benchmarks (configure with ATTN_BUILD_BENCH=ON)\n";
        return 2;
#else
        const std::string binary = ATTN_BENCH_BINARY;
        std::cout << "attn bench: " << (quick ? "quick run" : "full run")
                  << " (B=1, H=8, D=64; medians of repetitions; ratios within this run)\n";
        // The limit first: every BLIS configuration this CPU runs and the packed products; the run then times the
        // fastest BLIS configuration, BLIS's own pick and the packed products beside the library's gemm, and every
        // percentage is of the fastest gemm row.
        const BlisChoice choice = blis_choice();
        const MachineLimit limit = measure_machine_limit(quick ? 1024 : 2048, quick ? 1 : 2);
        std::cout << "\n";
        print_limit(choice, limit);
        std::vector<std::string> others;
        // "packed" (the library's packed products, detail::packed_blocked_gemm) always: on AVX-512 it is the limit.
        for (const std::string& c : {limit.fastest_sgemm.configuration, limit.fastest_dgemm.configuration, choice.own,
                                     std::string("packed")})
            if (c != choice.gemm && std::find(others.begin(), others.end(), c) == others.end()) others.push_back(c);
        std::string gemm_configs;
        for (const std::string& c : others) gemm_configs += (gemm_configs.empty() ? " --gemm-configs " : ",") + c;
        const std::string program = "'" + binary + "'" + (quick ? " --quick" : "") + gemm_configs;
        // --filter selects by config fields (suite::config_matches); Google Benchmark gets the exact names.
        const std::optional<std::string> selected = names_regex(program, filter);
        if (!selected) {
            std::cerr << "attn bench: no benchmark matches '" << filter << "'\n";
            return 2;
        }
        const std::string raw = (std::filesystem::temp_directory_path() /
                                 ("attn_bench_" + std::to_string(getpid()) + ".json")).string();
        const int code = run(program + (repetitions > 0 ? " --reps " + std::to_string(repetitions) : std::string()) +
                             (selected->empty() ? std::string() : " --benchmark_filter='" + *selected + "'") +
                             // Repetitions of all benchmarks in random order: a slow spell of the machine
                             // spreads over every row instead of sinking one row's median (seen: 487 ms vs 405 ms).
                             " --benchmark_enable_random_interleaving=true"
                             " --benchmark_display_aggregates_only=true --benchmark_out_format=json"
                             " --benchmark_out='" + raw + "'");
        if (code != 0) {
            std::cerr << "attn bench: the benchmark program failed (exit " << code << ")\n";
            return code;
        }
        json raw_json;
        {
            std::ifstream in(raw);
            raw_json = json::parse(in);
        }
        std::filesystem::remove(raw);
        // The benchmark program records the numerics fingerprint in its context (and so in --json's "context").
        const json context = raw_json.value("context", json::object());
        if (context.contains("attn_fingerprint"))
            std::cout << "\nmachine: fingerprint " << context.value("attn_fingerprint", "") << " (SIMD "
                      << context.value("attn_simd_chosen", "?") << ", BLIS " << context.value("attn_blis_arch", "?")
                      << ")\n";

        Measured measured = collect(raw_json);
        const json rows = print_rows(measured);

        MemoryFigures figures;
        const json memory = measure_memory(binary, quick, &figures);
        // The torch peer only where this run has a tiled float row it is compared with (self or backward).
        json torch_row = nullptr;
        const long backward_T = quick ? 2048 : 4096;
        bool have_backward = false;
        for (const auto& [name, r] : measured.by_name)
            have_backward = have_backward || ((r.kase == "backward" || r.kase == "self") && r.impl == "tiled" &&
                                              r.dtype == "float" && r.threads == 1 && r.Tq == backward_T);
        const TorchPeer torch = have_backward ? measure_torch(backward_T, &torch_row) : TorchPeer{};
        print_targets(measured, quick, figures, torch);

        if (!json_path.empty()) {
            std::ofstream out(json_path);
            out << json{{"quick", quick},     {"rows", rows},       {"memory", memory},
                        {"torch_peer", torch_row}, {"limit", limit_json(limit)}, {"blis_choice", choice_json(choice)},
                        {"context", context}}
                       .dump(2)
                << "\n";
            std::cout << "\nwrote " << json_path << "\n";
        }
        return 0;
#endif
    };
}

}  // namespace attn::cli
