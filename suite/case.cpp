// SdpaCase: config strings, the views implementations are called with, and exact JSON case files.
#include "attn/suite/case.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "attn/error.hpp"

namespace attn::suite {

CaseConfig config_of(const SdpaCase& c, const std::string& impl) {
    CaseConfig config;
    config.B = c.B, config.H = c.H, config.Tq = c.Tq, config.Tk = c.Tk, config.Dk = c.Dk, config.Dv = c.Dv;
    config.mask = c.mask_kind;
    config.mask_rank = c.allowed_mask ? c.allowed_mask->rank() : 0;
    config.mask_stride0 = c.mask_stride0;
    config.window = c.options.window;
    if (c.options.softcap != 0) config.softcap = c.options.softcap;
    config.bias = c.bias_kind;
    config.alibi = c.alibi_kind;
    config.kv_heads = c.kv_heads;
    config.dtype = c.dtype;
    config.values = c.distribution;
    config.logit_std = c.logit_std;
    config.seed = c.seed;
    config.scale = c.options.scale;
    config.empty_rows = c.options.empty_rows;
    config.check_finite = c.options.check_finite;
    config.threads = c.options.num_threads;
    config.impl = impl;
    return config;
}

std::string config_string(const SdpaCase& c, const std::string& impl) { return config_of(c, impl).to_config(); }

template <class T>
Tensor<T> cast_tensor(const Tensor<double>& t) {
    Tensor<T> r(t.shape());
    for (Index i = 0; i < t.numel(); ++i) r[i] = static_cast<T>(t[i]);
    return r;
}

namespace {

// A view (..., H or 1, Tq or 1, Tk or 1) of rank <= 4 in the grouped-query layout (B or 1, G or 1, R or 1, Tq, Tk),
// keeping strides: the head dim H = G R splits into (G, R).
template <class U>
TensorView<const U> grouped_view(TensorView<const U> m, Index G, Index R) {
    Shape one(static_cast<std::size_t>(4 - m.rank()), 1);
    Shape shape4 = one;
    shape4.insert(shape4.end(), m.shape().begin(), m.shape().end());
    Shape strides4(one.size(), 0);
    strides4.insert(strides4.end(), m.strides().begin(), m.strides().end());
    const TensorView<const U> m4(m.data(), shape4, strides4);
    const Index h = m4.dim(1);
    const Shape shape = {m4.dim(0), h == 1 ? 1 : G, h == 1 ? 1 : R, m4.dim(2), m4.dim(3)};
    const Shape strides = {m4.stride(0), h == 1 ? 0 : m4.stride(1) * R, h == 1 ? 0 : m4.stride(1), m4.stride(2),
                           m4.stride(3)};
    return TensorView<const U>(m4.data(), shape, strides);
}

}  // namespace

template <class T>
CaseInputs<T> make_inputs(const SdpaCase& c) {
    if (c.kv_heads < 1 || c.H % c.kv_heads != 0)
        throw ConfigError("suite case: kv_heads=" + std::to_string(c.kv_heads) + " does not divide H=" +
                          std::to_string(c.H));
    CaseInputs<T> in;
    in.q = cast_tensor<T>(c.q);
    in.k = cast_tensor<T>(c.k);
    in.v = cast_tensor<T>(c.v);
    const bool grouped = c.kv_heads > 1 && c.kv_heads < c.H;
    const Index G = c.kv_heads, R = c.H / c.kv_heads;
    if (!grouped) {
        // q (B, H, Tq, Dk); k (B, kv_heads, Tk, Dk) with kv_heads in {1, H}: NumPy broadcasting over heads.
        in.q_view = in.q.view();
        in.k_view = in.k.view();
        in.v_view = in.v.view();
    } else {
        // Grouped-query layout: q (B, G, R, Tq, Dk) (same memory); k, v (B, G, 1, Tk, D) broadcast over R.
        in.q_view = TensorView<const T>(in.q.data(), {c.B, G, R, c.Tq, c.Dk});
        in.k_view = TensorView<const T>(in.k.data(), {c.B, G, 1, c.Tk, c.Dk});
        in.v_view = TensorView<const T>(in.v.data(), {c.B, G, 1, c.Tk, c.Dv});
    }
    if (c.allowed_mask) {
        in.allowed_storage = *c.allowed_mask;
        TensorView<const bool> m = in.allowed_storage->view();
        if (c.mask_stride0) m = m.broadcast_to({c.B, c.H, c.Tq, c.Tk}, "suite case", "allowed_mask");
        if (grouped) m = grouped_view(m, G, R);  // (..., H or 1, Tq, Tk) -> (B|1, G|1, R|1, Tq, Tk)
        in.allowed_view = m;
    }
    if (c.bias) {
        in.bias_storage = cast_tensor<T>(*c.bias);
        const TensorView<const T> b = in.bias_storage->view();
        in.bias_view = grouped ? grouped_view(b, G, R) : b;
    }
    if (c.alibi_slopes) {
        // (H) or (B, H) against the batch shape (B, H); (G, R) or (B, G, R) in the grouped-query layout.
        in.alibi_storage = cast_tensor<T>(*c.alibi_slopes);
        const TensorView<const T> s = in.alibi_storage->view();
        if (!grouped) {
            in.alibi_view = s;
        } else {
            Shape shape = s.shape();
            shape.back() = G;
            shape.push_back(R);
            in.alibi_view = TensorView<const T>(s.data(), shape);
        }
    }
    return in;
}

template Tensor<float> cast_tensor<float>(const Tensor<double>&);
template Tensor<double> cast_tensor<double>(const Tensor<double>&);
template CaseInputs<float> make_inputs<float>(const SdpaCase&);
template CaseInputs<double> make_inputs<double>(const SdpaCase&);
template Tensor<float16> cast_tensor<float16>(const Tensor<double>&);
template Tensor<bfloat16> cast_tensor<bfloat16>(const Tensor<double>&);
template CaseInputs<float16> make_inputs<float16>(const SdpaCase&);
template CaseInputs<bfloat16> make_inputs<bfloat16>(const SdpaCase&);

void showValue(const SdpaCase& c, std::ostream& os) { os << config_string(c, "?"); }

// ---- JSON --------------------------------------------------------------------------------------------------

namespace {

using nlohmann::json;

// Every float is written as a C99 hex float ("0x1.8p+1"), exact for float and double; "nan", "inf", "-inf".
std::string hex(double x) {
    if (std::isnan(x)) return std::signbit(x) ? "-nan" : "nan";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", x);
    return buf;
}

double unhex(const std::string& s, const std::string& origin) {
    char* end = nullptr;
    const double x = std::strtod(s.c_str(), &end);
    if (end == s.c_str() || *end != '\0') throw IoError("case file " + origin + ": not a float: '" + s + "'");
    return x;
}

json tensor_json(const Tensor<double>& t) {
    json values = json::array();
    for (Index i = 0; i < t.numel(); ++i) values.push_back(hex(t[i]));
    return {{"shape", t.shape()}, {"values", values}};
}

Tensor<double> tensor_from(const json& j, const std::string& origin, const char* name) {
    if (!j.contains(name)) throw IoError("case file " + origin + ": missing tensor '" + name + "'");
    const json& t = j.at(name);
    Tensor<double> r(t.at("shape").get<Shape>());
    const json& values = t.at("values");
    if (static_cast<Index>(values.size()) != r.numel())
        throw IoError("case file " + origin + ": tensor '" + name + "' has " + std::to_string(values.size()) +
                      " values for shape " + to_string(r.shape()));
    for (Index i = 0; i < r.numel(); ++i) r[i] = unhex(values[static_cast<std::size_t>(i)].get<std::string>(), origin);
    return r;
}

// An enumerator of a case file by its spelling (attn/options.hpp); IoError naming the file otherwise.
template <class E>
E spelt(const json& value, const std::string& origin, const char* what) {
    try {
        return parse_spelling<E>(value.get<std::string>(), "case file " + origin, what);
    } catch (const ConfigError& e) {
        throw IoError(e.what());
    }
}

}  // namespace

std::string to_json(const CaseFile& f) {
    const SdpaCase& c = f.sdpa;
    json j;
    j["format"] = "attn-case/1";
    j["config"] = config_string(c, f.implementation);
    j["property"] = f.property;
    j["implementation"] = f.implementation;
    j["expected"] = f.expected;
    j["kills"] = f.kills;
    j["note"] = f.note;
    j["source"] = f.source;
    j["dtype"] = to_string(c.dtype);
    j["shape"] = {{"B", c.B}, {"H", c.H}, {"Tq", c.Tq}, {"Tk", c.Tk}, {"Dk", c.Dk}, {"Dv", c.Dv}, {"kv_heads", c.kv_heads}};
    j["options"] = {{"scale", c.options.scale ? json(hex(*c.options.scale)) : json(nullptr)},
                    {"is_causal", c.options.is_causal},
                    {"alignment", attn::to_string(c.options.alignment)},
                    {"window", c.options.window ? json{{"left", c.options.window->left},
                                                       {"right", c.options.window->right},
                                                       {"alignment", attn::to_string(c.options.window->alignment)}}
                                                : json(nullptr)},
                    {"empty_rows", attn::to_string(c.options.empty_rows)},
                    {"check_finite", c.options.check_finite},
                    {"num_threads", c.options.num_threads}};
    if (c.options.softcap != 0) j["options"]["softcap"] = hex(c.options.softcap);  // absent when off
    json m = {{"kind", c.mask_kind}, {"stride0", c.mask_stride0}};
    if (c.allowed_mask) {
        std::string bits;
        for (Index i = 0; i < c.allowed_mask->numel(); ++i) bits += (*c.allowed_mask)[i] ? '1' : '0';
        m["shape"] = c.allowed_mask->shape();
        m["allowed"] = bits;
    }
    j["mask"] = m;
    j["distribution"] = c.distribution;
    j["aux_seed"] = c.aux_seed;
    json params = json::object();
    for (const auto& [key, value] : c.params) params[key] = hex(value);
    j["params"] = params;
    j["q"] = tensor_json(c.q);
    j["k"] = tensor_json(c.k);
    j["v"] = tensor_json(c.v);
    if (c.bias) j["bias"] = {{"kind", c.bias_kind}, {"tensor", tensor_json(*c.bias)}};  // absent without one
    if (c.alibi_slopes) j["alibi"] = {{"kind", c.alibi_kind}, {"slopes", tensor_json(*c.alibi_slopes)}};
    return j.dump(1);
}

CaseFile case_from_json(const std::string& text, const std::string& origin) {
    json j;
    try {
        j = json::parse(text);
    } catch (const json::exception& e) {
        throw IoError("case file " + origin + ": " + e.what());
    }
    try {
        if (j.value("format", "") != "attn-case/1")
            throw IoError("case file " + origin + ": format must be \"attn-case/1\"");
        CaseFile f;
        f.property = j.at("property").get<std::string>();
        f.implementation = j.at("implementation").get<std::string>();
        f.expected = j.value("expected", "holds");
        f.kills = j.value("kills", std::vector<std::string>{});
        f.note = j.value("note", "");
        f.source = j.value("source", "");
        SdpaCase& c = f.sdpa;
        const std::string dtype = j.at("dtype").get<std::string>();
        try {
            c.dtype = dtype_from_string(dtype, "case file " + origin);
        } catch (const ConfigError& e) {
            throw IoError(e.what());
        }
        const json& s = j.at("shape");
        c.B = s.at("B"), c.H = s.at("H"), c.Tq = s.at("Tq"), c.Tk = s.at("Tk"), c.Dk = s.at("Dk"), c.Dv = s.at("Dv");
        c.kv_heads = s.value("kv_heads", c.H);
        const json& o = j.at("options");
        if (!o.at("scale").is_null()) c.options.scale = unhex(o.at("scale").get<std::string>(), origin);
        c.options.is_causal = o.at("is_causal");
        c.options.alignment = spelt<CausalAlignment>(o.at("alignment"), origin, "alignment");
        if (o.contains("window") && !o.at("window").is_null()) {
            const json& w = o.at("window");
            c.options.window = SlidingWindow{w.at("left").get<Index>(), w.at("right").get<Index>(),
                                             spelt<CausalAlignment>(w.at("alignment"), origin, "the window's alignment")};
        }
        if (o.contains("softcap")) c.options.softcap = unhex(o.at("softcap").get<std::string>(), origin);
        c.options.empty_rows = spelt<EmptyRowPolicy>(o.at("empty_rows"), origin, "empty_rows");
        c.options.check_finite = o.at("check_finite");
        c.options.num_threads = o.value("num_threads", 0);
        const json& m = j.at("mask");
        c.mask_kind = m.at("kind").get<std::string>();
        c.mask_stride0 = m.value("stride0", false);
        if (m.contains("allowed")) {
            Tensor<bool> a(m.at("shape").get<Shape>());
            const std::string bits = m.at("allowed").get<std::string>();
            if (static_cast<Index>(bits.size()) != a.numel())
                throw IoError("case file " + origin + ": mask has " + std::to_string(bits.size()) + " bits for shape " +
                              to_string(a.shape()));
            for (Index i = 0; i < a.numel(); ++i) a[i] = bits[static_cast<std::size_t>(i)] == '1';
            c.allowed_mask = std::move(a);
        }
        c.distribution = j.value("distribution", "normal");
        c.aux_seed = j.value("aux_seed", std::uint64_t{0});
        if (j.contains("params"))
            for (const auto& [key, value] : j.at("params").items()) c.params[key] = unhex(value.get<std::string>(), origin);
        c.q = tensor_from(j, origin, "q");
        c.k = tensor_from(j, origin, "k");
        c.v = tensor_from(j, origin, "v");
        if (j.contains("bias")) {
            c.bias_kind = j.at("bias").at("kind").get<std::string>();
            c.bias = tensor_from(j.at("bias"), origin, "tensor");
        }
        if (j.contains("alibi")) {
            c.alibi_kind = j.at("alibi").at("kind").get<std::string>();
            c.alibi_slopes = tensor_from(j.at("alibi"), origin, "slopes");
        }
        const Shape qs{c.B, c.H, c.Tq, c.Dk}, ks{c.B, c.kv_heads, c.Tk, c.Dk}, vs{c.B, c.kv_heads, c.Tk, c.Dv};
        if (c.q.shape() != qs || c.k.shape() != ks || c.v.shape() != vs)
            throw IoError("case file " + origin + ": tensor shapes q " + to_string(c.q.shape()) + ", k " +
                          to_string(c.k.shape()) + ", v " + to_string(c.v.shape()) + " do not match the shape block");
        return f;
    } catch (const json::exception& e) {
        throw IoError("case file " + origin + ": " + e.what());
    }
}

CaseFile read_case_file(const std::string& path) {
    std::ifstream in(path);
    if (!in) throw IoError("case file " + path + ": cannot open");
    std::stringstream ss;
    ss << in.rdbuf();
    return case_from_json(ss.str(), path);
}

std::string write_case_file(const CaseFile& file, const std::string& dir) {
    std::filesystem::create_directories(dir);
    const std::string impl = file.implementation == "*" ? "all" : file.implementation;  // no glob character in names
    const std::string path = dir + "/" + config_string(file.sdpa, impl) + "." + file.property + ".json";
    std::ofstream out(path);
    if (!out) throw IoError("case file " + path + ": cannot write");
    out << to_json(file) << "\n";
    return path;
}

}  // namespace attn::suite
