// The machine API the suite's per-target runs and every drift check rest on (attn/machine.hpp): forcing a SIMD
// target the CPU can run (drawn from simd_targets(), or "best") makes simd_target() and the numerics fingerprint name
// it, and the tiled backend still computes the case; any other name is refused with a ConfigError that lists the
// choices. The fingerprint's cpu is /proc/cpuinfo's vendor and model name; its id has the documented form, is
// decided by every field but the thread count, and changes when any one of those fields does. The previous target
// (the environment's ATTN_SIMD_TARGET, or the best) is put back.
#include <algorithm>
#include <cstdlib>
#include <fstream>

#include "../checks.hpp"
#include "attn/machine.hpp"

namespace attn::suite {

namespace {

// Lower case, '+' (between BLIS configurations) as '_': the id's spelling of its prefix.
std::string lower(std::string s) {
    for (char& ch : s) ch = ch == '+' ? '_' : static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
}

std::string joined(const std::vector<std::string>& xs) {
    std::string s;
    for (const std::string& x : xs) s += (s.empty() ? "" : " ") + x;
    return s;
}

// The fingerprint's own checks: the id's form, its independence of the thread count, and its change with each field
// that decides the bits.
Verdict fingerprint_verdict(const NumericsFingerprint& f, const std::string& target) {
    const std::string where = "the fingerprint under " + target;
    if (f.simd_chosen != target) return where + " names simd_chosen '" + f.simd_chosen + "'";
    if (f.simd_supported != joined(simd_targets()))
        return where + ": simd_supported '" + f.simd_supported + "' is not simd_targets() '" + joined(simd_targets()) + "'";
    if (f.cpu.empty() || f.blis_version.empty() || f.blis_arch.empty() || f.compiler.empty() || f.libc.empty())
        return where + " has an empty field";
    // The cpu field starts with the first "vendor_id" and "model name" lines of /proc/cpuinfo, read here on their own.
    std::ifstream in("/proc/cpuinfo");
    std::string vendor, model;
    for (std::string line; std::getline(in, line);) {
        const auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        const auto value = line.substr(std::min(line.size(), colon + 2));
        if (vendor.empty() && line.rfind("vendor_id", 0) == 0) vendor = value;
        if (model.empty() && line.rfind("model name", 0) == 0) model = value;
    }
    if (!vendor.empty() && !model.empty() && f.cpu.rfind(vendor + " " + model + " (family ", 0) != 0)
        return where + ": cpu '" + f.cpu + "' does not start with /proc/cpuinfo's '" + vendor + " " + model + " (family '";
    const std::string id = f.id(), prefix = lower(f.blis_arch + "-" + f.simd_chosen) + "-";
    const bool hex = id.size() == prefix.size() + 8 &&
                     id.find_first_not_of("0123456789abcdef", prefix.size()) == std::string::npos;
    if (id.rfind(prefix, 0) != 0 || !hex) return where + ": id '" + id + "' is not '" + prefix + "' and 8 hex digits";
    const std::vector<std::pair<std::string, std::string>> fields = f.fields();
    const std::vector<std::string> names = {"cpu", "simd_supported", "simd_chosen", "blis_version", "blis_arch",
                                            "compiler", "flags", "libc", "threads"};
    if (fields.size() != names.size()) return where + ": " + std::to_string(fields.size()) + " fields, not 9";
    for (std::size_t x = 0; x < names.size(); ++x)
        if (fields[x].first != names[x]) return where + ": field " + std::to_string(x) + " is '" + fields[x].first + "'";
    if (fields.back().second != std::to_string(f.threads)) return where + ": the threads field is not the thread count";
    NumericsFingerprint other = f;
    other.threads = f.threads + 1;
    if (other.id() != id) return where + ": the id changes with the thread count";
    // Each field that decides the bits, changed on its own, changes the id.
    for (std::string NumericsFingerprint::*field :
         {&NumericsFingerprint::cpu, &NumericsFingerprint::simd_supported, &NumericsFingerprint::simd_chosen,
          &NumericsFingerprint::blis_version, &NumericsFingerprint::blis_arch, &NumericsFingerprint::compiler,
          &NumericsFingerprint::flags, &NumericsFingerprint::libc}) {
        other = f;
        other.*field += "+";
        if (other.id() == id) return where + ": the id stays " + id + " when a field that decides the bits changes";
    }
    return std::nullopt;
}

}  // namespace

Property the_forced_simd_target_is_the_one_fingerprinted() {
    Property p;
    p.name = "the_forced_simd_target_is_the_one_fingerprinted";
    p.sentence = "Forcing a SIMD target this CPU can run (or the best) makes simd_target() and the numerics "
                 "fingerprint name it while the tiled backend computes the case; another name is refused with a "
                 "ConfigError listing the choices; the fingerprint's cpu is /proc/cpuinfo's vendor and model name "
                 "and its id has its documented form, ignores the thread "
                 "count and changes with every other field.";
    p.generator = [](Dtype d) { return gen::sdpa_case(d, {.small = true}); };
    p.applies = [](const Implementation& impl) { return impl.name == "tiled"; };
    p.check = [](const Implementation& impl, const SdpaCase& c) -> Verdict {
        Rng rng(c.aux_seed);
        const std::vector<std::string> usable = simd_targets();
        if (usable.empty()) return "simd_targets() is empty: the portable fallback is always there";
        for (const std::string& t : usable)
            if (!is_compiled_simd_target(t)) return "simd_targets() lists " + t + ", which is_compiled_simd_target denies";
        const std::string compiled = joined(simd_targets_compiled());
        // The target the run had, to put back: the environment's, or the best.
        const char* env = std::getenv("ATTN_SIMD_TARGET");
        const std::string previous = env && *env ? env : "best";
        const std::size_t pick = rng.below(usable.size() + 1);
        const std::string name = pick == usable.size() ? "best" : usable[pick];
        const std::string expected = name == "best" ? usable.front() : name;
        Verdict v = guarded("forcing " + name, [&]() -> Verdict {
            force_simd_target(name);
            if (simd_target() != expected)
                return "after force_simd_target(\"" + name + "\") simd_target() is " + simd_target();
            if (Verdict f = fingerprint_verdict(numerics_fingerprint(), expected)) return f;
            return with_dtype(c.dtype, [&]<class T>() -> Verdict {
                const Tensor<T> out = run_impl<T>(impl, c);
                return out.shape() == Shape{c.B, c.H, c.Tq, c.Dv} ? std::nullopt
                                                                  : Verdict("the output under " + name + " has shape " +
                                                                            to_string(out.shape()));
            });
        });
        if (!v)
            v = refused_with([] { force_simd_target("NOT_A_TARGET"); }, "force_simd_target(\"NOT_A_TARGET\")",
                             "ConfigError", "choose one of: " + joined(usable));
        if (!v && is_compiled_simd_target("NOT_A_TARGET")) v = "is_compiled_simd_target accepts NOT_A_TARGET";
        if (!v && compiled.find(usable.front()) == std::string::npos)
            v = "simd_targets_compiled() '" + compiled + "' lacks the best usable target " + usable.front();
        force_simd_target(previous);
        return v;
    };
    return p;
}

}  // namespace attn::suite
