// Config strings: writing the canonical form and parsing it back.
#include "attn/suite/config.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>
#include <sstream>

#include "attn/error.hpp"
#include "attn/options.hpp"

namespace attn::suite {

const char* to_string(Dtype dtype) {
    switch (dtype) {
        case Dtype::Float: return "float";
        case Dtype::Double: return "double";
        case Dtype::Float16: return "float16";
        case Dtype::BFloat16: return "bfloat16";
    }
    return "?";
}

const std::vector<Dtype>& all_dtypes() {
    static const std::vector<Dtype> all{Dtype::Float, Dtype::Double, Dtype::Float16, Dtype::BFloat16};
    return all;
}

Dtype dtype_from_string(const std::string& name, const std::string& context) {
    for (const Dtype d : all_dtypes())
        if (name == to_string(d)) return d;
    throw ConfigError(context + ": dtype '" + name + "' (known: float, double, float16, bfloat16)");
}

double round_to_dtype(Dtype dtype, double x) {
    switch (dtype) {
        case Dtype::Float: return static_cast<float>(x);
        case Dtype::Double: return x;
        case Dtype::Float16: return static_cast<float>(float16(x));
        case Dtype::BFloat16: return static_cast<float>(bfloat16(x));
    }
    return x;
}

namespace {

// The keys of the options a config string carries: the option table's config column (attn/options.hpp), one name per
// option for every interface's spelling of it.
struct OptionKeys {
    std::string scale = option_spec("scale").config;
    std::string softcap = option_spec("softcap").config;
    std::string bias = option_spec("bias").config;
    std::string alibi = option_spec("alibi_slopes").config;
    std::string empty_rows = option_spec("empty_rows").config;
    std::string check_finite = option_spec("check_finite").config;
    std::string threads = option_spec("num_threads").config;
    std::string window = option_spec("window").config;
};
const OptionKeys& option_key() {
    static const OptionKeys keys;
    return keys;
}
template <class H>
double next_up_16(double x) {
    const H h(x);
    const float f = h;
    if (f == 0) return static_cast<float>(std::numeric_limits<H>::denorm_min());
    return static_cast<float>(H::from_bits(static_cast<std::uint16_t>(f > 0 ? h.bits + 1 : h.bits - 1)));
}
}  // namespace

double next_up_in(Dtype dtype, double x) {
    switch (dtype) {
        case Dtype::Float: return std::nextafter(static_cast<float>(x), std::numeric_limits<float>::infinity());
        case Dtype::Double: return std::nextafter(x, std::numeric_limits<double>::infinity());
        case Dtype::Float16: return next_up_16<float16>(x);
        case Dtype::BFloat16: return next_up_16<bfloat16>(x);
    }
    return x;
}

std::string format_number(double x) {
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, x);
    return std::string(buf, r.ptr);
}

std::string format_number(double x, Dtype dtype) {
    if (!scale_is_float(dtype) || static_cast<double>(static_cast<float>(x)) != x) return format_number(x);
    char buf[64];
    const auto r = std::to_chars(buf, buf + sizeof buf, static_cast<float>(x));
    return std::string(buf, r.ptr);
}

namespace {

// A free-form field (mask kind, values, impl) must not contain the characters that delimit fields.
const std::string& checked(const std::string& value, const char* field) {
    if (value.empty() || value.find_first_of(",()= ") != std::string::npos)
        throw ConfigError("config string: field " + std::string(field) + " '" + value +
                          "' is empty or holds one of , ( ) = or a space");
    return value;
}

std::string window_field(const SlidingWindow& w) {
    return std::to_string(w.left) + ":" + std::to_string(w.right) + ":" +
           (w.alignment == CausalAlignment::TopLeft ? "tl" : "br");
}

std::string hex(std::uint64_t x) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(x));
    return buf;
}

}  // namespace

std::string CaseConfig::to_config() const {
    std::ostringstream s;
    s << checked(op, "op") << "(B=" << B << ",H=" << H << ",Tq=" << Tq << ",Tk=" << Tk << ",Dk=" << Dk << ",Dv=" << Dv
      << ",mask=" << checked(mask, "mask");
    if (mask_rank > 0) s << "-r" << mask_rank;
    if (mask_stride0) s << "-stride0";
    if (window) s << "," << option_key().window << "=" << window_field(*window);
    if (kv_heads != H) s << ",kv_heads=" << kv_heads;
    s << ",dtype=" << to_string(dtype);
    if (values != "normal") s << ",values=" << checked(values, "values");
    if (logit_std) s << ",logit_std=" << format_number(*logit_std);
    if (seed) s << ",seed=" << hex(*seed);
    if (scale) s << "," << option_key().scale << "=" << format_number(*scale, dtype);
    if (softcap) s << "," << option_key().softcap << "=" << format_number(*softcap, dtype);
    if (bias != "none") s << "," << option_key().bias << "=" << checked(bias, "bias");
    if (alibi != "none") s << "," << option_key().alibi << "=" << checked(alibi, "alibi");
    if (empty_rows != EmptyRowPolicy::Throw) s << "," << option_key().empty_rows << "=" << to_string(empty_rows);
    if (!check_finite) s << "," << option_key().check_finite << "=off";
    if (threads != 0) s << "," << option_key().threads << "=" << threads;
    s << ",impl=" << checked(impl, "impl") << ")";
    return s.str();
}

std::vector<std::pair<std::string, std::string>> config_fields(const std::string& text) {
    std::vector<std::pair<std::string, std::string>> fields;
    std::string body = text;
    const auto open = text.find('(');
    if (open != std::string::npos) {
        if (text.back() != ')' || open == 0)
            throw ConfigError("config string '" + text + "': expected op(field=value,...)");
        fields.emplace_back("op", text.substr(0, open));
        body = text.substr(open + 1, text.size() - open - 2);
    }
    std::stringstream ss(body);
    std::string item;
    while (std::getline(ss, item, ',')) {
        const auto eq = item.find('=');
        if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
            throw ConfigError("config string '" + text + "': '" + item + "' is not field=value");
        fields.emplace_back(item.substr(0, eq), item.substr(eq + 1));
    }
    return fields;
}

namespace {

template <class Int>
Int parse_int(const std::string& text, const std::string& field, const std::string& value, int base = 10) {
    Int x{};
    const char* begin = value.data();
    if (base == 16) {
        if (value.rfind("0x", 0) != 0) throw ConfigError("config string '" + text + "': " + field + " must be 0x<hex>");
        begin += 2;
    }
    const auto r = std::from_chars(begin, value.data() + value.size(), x, base);
    if (r.ec != std::errc() || r.ptr != value.data() + value.size())
        throw ConfigError("config string '" + text + "': " + field + "=" + value + " is not an integer");
    return x;
}

double parse_double(const std::string& text, const std::string& field, const std::string& value) {
    double x = 0;
    const auto r = std::from_chars(value.data(), value.data() + value.size(), x);
    if (r.ec != std::errc() || r.ptr != value.data() + value.size() || !std::isfinite(x))
        throw ConfigError("config string '" + text + "': " + field + "=" + value + " is not a finite number");
    return x;
}

bool ends_with(const std::string& s, const std::string& tail) {
    return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

}  // namespace

CaseConfig parse_config(const std::string& text) {
    const auto fields = config_fields(text);
    if (fields.empty() || fields.front().first != "op")
        throw ConfigError("config string '" + text + "': expected op(field=value,...), e.g. sdpa(B=1,...)");
    CaseConfig c;
    c.op = checked(fields.front().second, "op");
    std::set<std::string> seen;
    bool kv_given = false;
    for (std::size_t n = 1; n < fields.size(); ++n) {
        const auto& [key, value] = fields[n];
        if (!seen.insert(key).second) throw ConfigError("config string '" + text + "': field " + key + " given twice");
        if (key == "B") c.B = parse_int<Index>(text, key, value);
        else if (key == "H") c.H = parse_int<Index>(text, key, value);
        else if (key == "Tq") c.Tq = parse_int<Index>(text, key, value);
        else if (key == "Tk") c.Tk = parse_int<Index>(text, key, value);
        else if (key == "Dk") c.Dk = parse_int<Index>(text, key, value);
        else if (key == "Dv") c.Dv = parse_int<Index>(text, key, value);
        else if (key == "kv_heads") c.kv_heads = parse_int<Index>(text, key, value), kv_given = true;
        else if (key == "mask") {
            std::string kind = value;
            if (ends_with(kind, "-stride0")) c.mask_stride0 = true, kind.resize(kind.size() - 8);
            const auto r = kind.rfind("-r");
            if (r != std::string::npos && r + 2 < kind.size() &&
                kind.find_first_not_of("0123456789", r + 2) == std::string::npos) {
                c.mask_rank = parse_int<Index>(text, key, kind.substr(r + 2));
                kind.resize(r);
            }
            c.mask = checked(kind, "mask");
        } else if (key == option_key().window) {
            const auto a = value.find(':'), b = value.rfind(':');
            const std::string side = b == std::string::npos ? "" : value.substr(b + 1);
            if (a == std::string::npos || a == b || (side != "tl" && side != "br"))
                throw ConfigError("config string '" + text + "': window=" + value + " is not LEFT:RIGHT:tl|br");
            c.window = SlidingWindow{parse_int<Index>(text, "window's left", value.substr(0, a)),
                                     parse_int<Index>(text, "window's right", value.substr(a + 1, b - a - 1)),
                                     side == "tl" ? CausalAlignment::TopLeft : CausalAlignment::BottomRight};
        } else if (key == "dtype") {
            c.dtype = dtype_from_string(value, "config string '" + text + "'");
        } else if (key == "values") c.values = checked(value, "values");
        else if (key == "logit_std") c.logit_std = parse_double(text, key, value);
        else if (key == "seed") c.seed = parse_int<std::uint64_t>(text, key, value, 16);
        else if (key == option_key().scale) c.scale = parse_double(text, key, value);  // rounded to the dtype below
        else if (key == option_key().softcap) c.softcap = parse_double(text, key, value);  // the same
        else if (key == option_key().bias) c.bias = checked(value, "bias");
        else if (key == option_key().alibi) c.alibi = checked(value, "alibi");
        else if (key == option_key().empty_rows) {
            c.empty_rows = parse_spelling<EmptyRowPolicy>(value, "config string '" + text + "'", option_key().empty_rows);
        } else if (key == option_key().check_finite) {
            if (value != "on" && value != "off")
                throw ConfigError("config string '" + text + "': check_finite=" + value + " (known: on, off)");
            c.check_finite = value == "on";
        } else if (key == option_key().threads) c.threads = parse_int<int>(text, key, value);
        else if (key == "impl") c.impl = checked(value, "impl");
        else
            throw ConfigError("config string '" + text + "': unknown field '" + key +
                              "' (known: B, H, Tq, Tk, Dk, Dv, mask, window, kv_heads, dtype, values, logit_std, seed, scale, softcap, "
                              "bias, alibi, empty_rows, check_finite, threads, impl)");
    }
    for (const char* required : {"B", "H", "Tq", "Tk", "Dk", "Dv", "mask", "dtype", "impl"})
        if (!seen.count(required)) throw ConfigError("config string '" + text + "': field " + required + " is missing");
    if (!kv_given) c.kv_heads = c.H;
    // A float case's scale (and a 16-bit one's, which scales in float) is written as the shortest float: read it
    // back as that float.
    for (auto [name, field] : {std::pair{&option_key().scale, &c.scale}, std::pair{&option_key().softcap, &c.softcap}}) {
        if (!*field || !scale_is_float(c.dtype)) continue;
        const double f = static_cast<double>(static_cast<float>(**field));
        for (const auto& [key, value] : fields)
            if (key == *name && format_number(f, Dtype::Float) == value) *field = f;
    }
    return c;
}

namespace {

// Every value a filter field may name for this config: its written value, its default when left out, and for the
// mask also the bare kind ("random" for "random-r3-stride0").
std::vector<std::string> field_values(const CaseConfig& c, const std::string& key) {
    const auto opt = [](const auto& o, std::string fallback, auto&& fmt) -> std::string {
        return o ? fmt(*o) : fallback;
    };
    if (key == "op") return {c.op};
    if (key == "B") return {std::to_string(c.B)};
    if (key == "H") return {std::to_string(c.H)};
    if (key == "Tq") return {std::to_string(c.Tq)};
    if (key == "Tk") return {std::to_string(c.Tk)};
    if (key == "Dk") return {std::to_string(c.Dk)};
    if (key == "Dv") return {std::to_string(c.Dv)};
    if (key == "mask") {
        const std::string full = config_fields(c.to_config())[7].second;  // op, B, H, Tq, Tk, Dk, Dv, mask
        return {full, c.mask};
    }
    if (key == option_key().window) return {opt(c.window, "none", window_field)};
    if (key == "kv_heads") return {std::to_string(c.kv_heads)};
    if (key == "dtype") return {to_string(c.dtype)};
    if (key == "values") return {c.values};
    if (key == "logit_std") return {opt(c.logit_std, "", [](double x) { return format_number(x); })};
    if (key == "seed") return {opt(c.seed, "", hex)};
    if (key == option_key().scale) return {opt(c.scale, "", [&](double x) { return format_number(x, c.dtype); })};
    if (key == option_key().softcap) return {opt(c.softcap, "0", [&](double x) { return format_number(x, c.dtype); })};
    if (key == option_key().bias) return {c.bias};
    if (key == option_key().alibi) return {c.alibi};
    if (key == option_key().empty_rows) return {to_string(c.empty_rows)};
    if (key == option_key().check_finite) return {c.check_finite ? "on" : "off"};
    if (key == option_key().threads) return {std::to_string(c.threads)};
    if (key == "impl") return {c.impl};
    throw ConfigError("config filter: unknown field '" + key + "'");
}

}  // namespace

namespace {

// A filter's alternatives: the parts between '|' ("impl=blis|mask=window" is two).
std::vector<std::string> alternatives(const std::string& filter) {
    std::vector<std::string> parts;
    std::size_t start = 0;
    for (std::size_t bar; (bar = filter.find('|', start)) != std::string::npos; start = bar + 1)
        parts.push_back(filter.substr(start, bar - start));
    parts.push_back(filter.substr(start));
    return parts;
}

}  // namespace

void check_filter(const std::string& filter) {
    if (filter.empty()) return;
    if (filter.find('|') != std::string::npos) {
        for (const std::string& part : alternatives(filter)) {
            if (part.empty()) throw ConfigError("filter '" + filter + "': an empty alternative between '|'");
            check_filter(part);
        }
        return;
    }
    if (filter.find('(') != std::string::npos) {
        (void)parse_config(filter);
        return;
    }
    CaseConfig any;
    any.impl = "any";
    for (const auto& field : config_fields(filter)) (void)field_values(any, field.first);
}

bool config_matches(const std::string& config, const std::string& filter) {
    if (filter.empty()) return true;
    if (filter.find('|') != std::string::npos) {
        const std::vector<std::string> parts = alternatives(filter);
        return std::any_of(parts.begin(), parts.end(), [&](const std::string& part) {
            return !part.empty() && config_matches(config, part);
        });
    }
    if (filter.find('(') != std::string::npos) return config == filter;
    const CaseConfig c = parse_config(config);
    for (const auto& [key, want] : config_fields(filter)) {
        const std::vector<std::string> have = field_values(c, key);
        if (std::find(have.begin(), have.end(), want) == have.end()) return false;
    }
    return true;
}

}  // namespace attn::suite
