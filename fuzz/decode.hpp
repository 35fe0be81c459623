// fuzz/decode.hpp: the one decoder every fuzz target shares (bytes -> shapes, strided views, masks, values, options)
// plus the independent model the targets check the library against. The model is independent of the library's
// contract module (attn/detail/problem.hpp) on purpose, so a contract bug cannot hide in both.
//
// Layout of an input: FuzzedDataProvider hands out structure (shapes, layouts, options, mask bits) first and
// values last, so a mutation of the structure does not shift every value. An exhausted input decodes to zeros,
// i.e. small shapes of size 1 and the value -2: every input, even the empty one, is a valid case.
//
// How to add a target: write fuzz/targets/<name>.cpp with LLVMFuzzerTestOneInput, add <name> to ATTN_FUZZ_TARGETS
// in fuzz/CMakeLists.txt, and commit a few seed files under fuzz/corpus/<name>/.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "attn/attn.hpp"

namespace attn::fuzz {

// ---------------------------------------------------------------------------------------------------------------
// Failing a property: one line naming the property and the case's config string, then abort (libFuzzer, AFL++ and
// the replay main all treat abort as a finding).

inline std::string& current_config() {
    static std::string config;
    return config;
}

[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
    std::fprintf(stderr, "attn-fuzz: property violated: %s\n  case: %s\n  at %s:%d\n", what.c_str(),
                 current_config().c_str(), file, line);
    std::fflush(stderr);
    std::abort();
}

#define ATTN_FUZZ_REQUIRE(cond, what)                                                     \
    do {                                                                                  \
        if (!(cond)) ::attn::fuzz::fail(__FILE__, __LINE__, std::string(#cond ": ") + (what)); \
    } while (0)

inline bool contains(const std::string& haystack, const std::string& needle) {
    return haystack.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------------------------------------------
// Values. FuzzedDataProvider's floating-point helpers never return NaN or Inf, so special values come from a
// table and from raw bits.

template <class T>
struct Bits;
template <>
struct Bits<float> {
    using type = std::uint32_t;
};
template <>
struct Bits<double> {
    using type = std::uint64_t;
};
template <>
struct Bits<float16> {
    using type = std::uint16_t;
};
template <>
struct Bits<bfloat16> {
    using type = std::uint16_t;
};

// "float", "double", "float16", "bfloat16": the dtype in a target's config line.
template <class T>
constexpr const char* dtype_name() {
    if constexpr (std::is_same_v<T, float>) return "float";
    else if constexpr (std::is_same_v<T, double>) return "double";
    else if constexpr (std::is_same_v<T, float16>) return "float16";
    else return "bfloat16";
}

// Which 16-bit storage type a float case runs in instead, from three bits of its profile byte that no target gives
// another meaning (7: float16, 6: bfloat16, else float itself): a quarter of the float inputs, chosen before the
// values are read so that the bytes mean the same thing whatever the type. 0: float.
inline int sixteen_bit_choice(unsigned three_bits) { return three_bits == 7 ? 16 : three_bits == 6 ? 8 : 0; }

template <class T>
T from_bits(typename Bits<T>::type bits) {
    if constexpr (attn::is_half_v<T>) {
        return T::from_bits(bits);
    } else {
        T x;
        std::memcpy(&x, &bits, sizeof x);
        return x;
    }
}

// How wild the values of one case may be. Tame cases are what most users feed (so properties about finite outputs
// get exercised); wild cases hit the NaN/Inf/overflow contracts.
struct ValueProfile {
    bool specials = false;  // NaN, Inf, subnormals, +-max, raw bit patterns
    bool wide = false;      // exponents up to 2^+-40 (logit overflow for float when D is large enough)
};

template <class T>
class ValueSource {
public:
    ValueSource(FuzzedDataProvider& in, ValueProfile profile) : in_(in), profile_(profile) {}

    T next() {
        const auto tag = in_.ConsumeIntegral<std::uint8_t>();
        const unsigned kind = tag >> 5, low = tag & 31u;
        T x;
        switch (kind) {
            case 0:
            case 1:
            case 2:  // small multiples of 1/8 in [-2, 1.875]: exact in every dtype, so ties are exact ties
                if constexpr (is_half_v<T>) x = static_cast<T>((static_cast<int>(low) - 16) / 8.0);
                else x = static_cast<T>(static_cast<int>(low) - 16) / T(8);
                break;
            case 4:
                x = profile_.wide ? wide_value(low) : fraction();
                break;
            case 5:
                x = profile_.specials ? special(low) : fraction();
                break;
            case 6:
                x = profile_.specials ? from_bits<T>(in_.ConsumeIntegral<typename Bits<T>::type>()) : fraction();
                break;
            case 7:  // repeat: exact ties across positions
                x = last_;
                break;
            default:
                x = fraction();
                break;
        }
        last_ = x;
        return x;
    }

private:
    T fraction() {  // [-8, 8) on a grid of 1/4096
        return static_cast<T>(static_cast<double>(in_.ConsumeIntegral<std::uint16_t>()) / 4096.0 - 8.0);
    }
    T wide_value(unsigned low) {
        const double mantissa = 1.0 + static_cast<double>(in_.ConsumeIntegral<std::uint8_t>()) / 256.0;
        const int exponent = static_cast<int>(low & 15u) * 5 - 40;  // 2^-40 .. 2^35
        return static_cast<T>((low & 16u ? -1.0 : 1.0) * std::ldexp(mantissa, exponent));
    }
    static T special(unsigned low) {
        using L = std::numeric_limits<T>;
        if constexpr (is_half_v<T>) {  // the same table, computed in double (the types only store)
            const double max = static_cast<float>(L::max()), min = static_cast<float>(L::min());
            switch (low & 15u) {
                case 0: return L::quiet_NaN();
                case 1: return T(-std::numeric_limits<double>::quiet_NaN());
                case 2: return L::infinity();
                case 3: return T(-std::numeric_limits<double>::infinity());
                case 4: return L::denorm_min();
                case 5: return T(-static_cast<double>(static_cast<float>(L::denorm_min())));
                case 6: return L::min();
                case 7: return L::max();
                case 8: return L::lowest();
                case 9: return T(-0.0);
                case 10: return T(0.0);
                case 11: return L::epsilon();
                case 12: return T(std::sqrt(max));
                case 13: return T(-std::sqrt(max));
                case 14: return T(min / 3);
                default: return L::signaling_NaN();
            }
        } else {
        switch (low & 15u) {
            case 0: return L::quiet_NaN();
            case 1: return -L::quiet_NaN();
            case 2: return L::infinity();
            case 3: return -L::infinity();
            case 4: return L::denorm_min();
            case 5: return -L::denorm_min();
            case 6: return L::min();
            case 7: return L::max();
            case 8: return -L::max();
            case 9: return -T(0);
            case 10: return T(0);
            case 11: return L::epsilon();
            case 12: return std::sqrt(L::max());  // its square overflows
            case 13: return -std::sqrt(L::max());
            case 14: return L::min() / T(3);  // a subnormal
            default: return L::signaling_NaN();
        }
        }
    }

    FuzzedDataProvider& in_;
    ValueProfile profile_;
    T last_ = T(1);
};

// ---------------------------------------------------------------------------------------------------------------
// Strided operands: owning storage plus a view with the layout the fuzzer chose (transposed last two dims, padded
// rows, stride-0 dims). Storage positions the view does not reach hold a sentinel (NaN for floats), so a backend
// that reads outside its view shows up as a NaN or a ValueError the model did not predict.

struct Layout {
    bool transpose_last = false;  // storage order (..., last, second-to-last)
    Index pad = 0;                // extra elements after each innermost storage row
    std::uint32_t zero_stride = 0;  // bit d: dim d has stride 0 (one stored copy broadcast along it)

    static Layout decode(FuzzedDataProvider& in) {
        Layout l;
        const auto b = in.ConsumeIntegral<std::uint8_t>();
        l.transpose_last = b & 1u;
        l.pad = (b >> 1) & 3u;
        if (l.pad == 3) l.pad = 0;
        l.zero_stride = (b & 0x80u) ? in.ConsumeIntegral<std::uint8_t>() : 0u;
        return l;
    }
    std::string describe() const {
        std::string s;
        if (transpose_last) s += "T";
        if (pad) s += "p" + std::to_string(pad);
        if (zero_stride) s += "z" + std::to_string(zero_stride);
        return s.empty() ? "c" : s;
    }
};

template <class T>
struct Operand {
    std::string name;
    Tensor<T> storage;  // 1-D
    TensorView<const T> view;
    Layout layout;

    Operand() = default;
    Operand(const Operand&) = delete;
    Operand& operator=(const Operand&) = delete;
    Operand(Operand&&) noexcept = default;
    Operand& operator=(Operand&&) noexcept = default;
};

template <class T>
T sentinel() {
    if constexpr (std::is_same_v<T, bool>) return true;
    else return std::numeric_limits<T>::quiet_NaN();
}

// Builds storage and view for `shape` in `layout`; fill(storage_offset) is called for every position the view
// reaches (repeatedly for stride-0 dims: the last call wins, as with any aliasing view).
template <class T, class Fill>
Operand<T> make_operand(std::string name, const Shape& shape, const Layout& layout, Fill&& fill) {
    const std::size_t r = shape.size();
    std::vector<std::size_t> order(r);  // storage order, outermost first
    for (std::size_t d = 0; d < r; ++d) order[d] = d;
    if (layout.transpose_last && r >= 2) std::swap(order[r - 1], order[r - 2]);
    Shape strides(r, 0);
    Index acc = 1;
    for (std::size_t n = r; n-- > 0;) {
        const std::size_t d = order[n];
        if (d < 32 && (layout.zero_stride >> d) & 1u) continue;  // stride 0
        strides[d] = acc;
        acc *= std::max<Index>(shape[d] + (n + 1 == r ? layout.pad : 0), 1);
    }
    Operand<T> op;
    op.name = std::move(name);
    op.layout = layout;
    op.storage = Tensor<T>({acc}, sentinel<T>());
    op.view = TensorView<const T>(op.storage.data(), shape, strides);
    for_each_index(shape, [&](std::span<const Index> idx) {
        Index off = 0;
        for (std::size_t d = 0; d < r; ++d) off += idx[d] * strides[d];
        op.storage[off] = fill(off);
    });
    return op;
}

// Element of `view` at index `idx` of the broadcast shape `target` (NumPy rules), computed here from shapes and
// strides alone, independently of the library's broadcast_to.
template <class T>
T broadcast_get(const TensorView<const T>& view, const Shape& target, std::span<const Index> idx) {
    const std::size_t r = static_cast<std::size_t>(view.rank()), shift = target.size() - r;
    Index off = 0;
    for (std::size_t d = 0; d < r; ++d) {
        const Index i = view.shape()[d] == 1 ? 0 : idx[shift + d];
        off += i * view.strides()[d];
    }
    return view.data()[off];
}

// A contiguous copy of `view` broadcast to `target`.
template <class T>
Tensor<T> expand(const TensorView<const T>& view, const Shape& target) {
    Tensor<T> out(target);
    Index n = 0;
    for_each_index(target, [&](std::span<const Index> idx) { out[n++] = broadcast_get(view, target, idx); });
    return out;
}

// NumPy broadcast of shapes, or nullopt; the model's own, not the library's.
inline std::optional<Shape> broadcast_model(const Shape& a, const Shape& b) {
    const std::size_t r = std::max(a.size(), b.size());
    Shape out(r, 1);
    for (std::size_t i = 0; i < r; ++i) {
        const Index da = i + a.size() < r ? 1 : a[i + a.size() - r];
        const Index db = i + b.size() < r ? 1 : b[i + b.size() - r];
        if (da != db && da != 1 && db != 1) return std::nullopt;
        out[i] = da == 1 ? db : da;
    }
    return out;
}

// ---------------------------------------------------------------------------------------------------------------
// Shapes: a batch shape (rank 0..3, extents 1..3) and Tq, Tk, Dk, Dv in 1..max, with rare zero extents.

struct Dims {
    Shape batch;
    Index Tq = 1, Tk = 1, Dk = 1, Dv = 1;

    static Dims decode(FuzzedDataProvider& in, Index max_t = 9, Index max_d = 9) {
        Dims s;
        const int rank = in.ConsumeIntegralInRange<int>(0, 3);
        for (int d = 0; d < rank; ++d) s.batch.push_back(1 + in.ConsumeIntegralInRange<Index>(0, 2));
        s.Tq = 1 + in.ConsumeIntegralInRange<Index>(0, max_t - 1);
        s.Tk = 1 + in.ConsumeIntegralInRange<Index>(0, max_t - 1);
        s.Dk = 1 + in.ConsumeIntegralInRange<Index>(0, max_d - 1);
        s.Dv = 1 + in.ConsumeIntegralInRange<Index>(0, max_d - 1);
        // Rarely, one extent is zero: empty batches, no queries, no keys (every row empty), Dk = 0, Dv = 0.
        const auto zero = in.ConsumeIntegral<std::uint8_t>();
        if (zero >= 250) {
            switch (zero - 250) {
                case 0: s.Tq = 0; break;
                case 1: s.Tk = 0; break;
                case 2: s.Dk = 0; break;
                case 3: s.Dv = 0; break;
                case 4: if (!s.batch.empty()) s.batch.back() = 0; break;
                default: break;
            }
        }
        return s;
    }
    Shape scores() const {
        Shape s = batch;
        s.push_back(Tq);
        s.push_back(Tk);
        return s;
    }
    std::string describe() const {
        return "B=" + to_string(batch) + ",Tq=" + std::to_string(Tq) + ",Tk=" + std::to_string(Tk) +
               ",Dk=" + std::to_string(Dk) + ",Dv=" + std::to_string(Dv);
    }
};

// A shape that broadcasts to `full`: each dim kept or set to 1, and up to `drop` leading dims dropped.
inline Shape broadcastable_shape(FuzzedDataProvider& in, const Shape& full, std::size_t keep_trailing) {
    const auto bits = in.ConsumeIntegral<std::uint8_t>();
    const std::size_t droppable = full.size() - keep_trailing;
    const std::size_t drop = std::min<std::size_t>(in.ConsumeIntegralInRange<std::size_t>(0, 3), droppable);
    Shape s(full.begin() + static_cast<std::ptrdiff_t>(drop), full.end());
    for (std::size_t d = 0; d < s.size(); ++d)
        if ((bits >> (d % 8)) & 1u) s[d] = 1;
    return s;
}

// ---------------------------------------------------------------------------------------------------------------
// Masks.

enum class MaskKind : std::uint8_t { None, Random, Causal, KeyPadding, EmptyRow, AllBlocked, Count };

inline const char* kind_name(MaskKind kind) {
    switch (kind) {
        case MaskKind::None: return "none";
        case MaskKind::Random: return "random";
        case MaskKind::Causal: return "causal";
        case MaskKind::KeyPadding: return "padding";
        case MaskKind::EmptyRow: return "empty-row";
        case MaskKind::AllBlocked: return "all-blocked";
        default: return "?";
    }
}

struct MaskSpec {
    MaskKind kind = MaskKind::None;
    Shape shape;  // broadcastable to the scores shape (unless the target corrupts it)
    Layout layout;
    CausalAlignment alignment = CausalAlignment::TopLeft;
    std::uint8_t density = 128;  // P(allowed) = density / 256 for random bits
    Index empty_row = 0;
};

inline MaskSpec decode_mask_spec(FuzzedDataProvider& in, const Dims& dims) {
    MaskSpec m;
    m.kind = static_cast<MaskKind>(in.ConsumeIntegralInRange<int>(0, static_cast<int>(MaskKind::Count) - 1));
    const Shape scores = dims.scores();
    switch (m.kind) {
        case MaskKind::None: break;
        case MaskKind::Causal: {  // batch dims may broadcast; the (Tq, Tk) pattern is the full causal one
            m.shape = broadcastable_shape(in, scores, 2);
            m.shape[m.shape.size() - 2] = dims.Tq;
            m.shape[m.shape.size() - 1] = dims.Tk;
            break;
        }
        case MaskKind::KeyPadding: {  // (batch..., 1, Tk) or shorter: one row of keys for every query
            m.shape = broadcastable_shape(in, scores, 2);
            m.shape[m.shape.size() - 2] = 1;
            break;
        }
        default: m.shape = broadcastable_shape(in, scores, 2); break;
    }
    m.layout = Layout::decode(in);
    m.alignment = in.ConsumeBool() ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
    m.density = in.ConsumeIntegral<std::uint8_t>();
    m.empty_row = in.ConsumeIntegral<std::uint8_t>();
    return m;
}

// The case's sliding window, from bits of the mask spec the mask never reads (its density reads only the top two):
// bits 0-1 equal to 01 turn it on (a quarter of the inputs), bits 2-3 and 4-5 pick left and right from {-1, 0, 1, 4};
// its alignment is the mask spec's. Taken from existing bits, so inputs decode the same shapes as before; 01 is the
// pattern no saved finding of regressions/fuzz has, so each still decodes the case it was saved for.
inline std::optional<SlidingWindow> decode_window(const MaskSpec& m) {
    if ((m.density & 3u) != 1u) return std::nullopt;
    constexpr Index sides[] = {-1, 0, 1, 4};
    return SlidingWindow{sides[(m.density >> 2) & 3u], sides[(m.density >> 4) & 3u], m.alignment};
}

// The case's soft-cap (SdpaOptions::softcap), from the same spare bits: bits 0-1 equal to 10 (never together with a
// window) and bit 6 of the empty-row byte (which an empty-row mask reads modulo Tq) turn it on, an eighth of the
// inputs; bits 2-3 pick the cap from {0.5, 2, 30, 1e4}: saturating, moderate and nearly plain attention. Three
// saved findings of regressions/fuzz have the pattern 10, none with that bit, so each still decodes its own case.
inline double decode_softcap(const MaskSpec& m) {
    if ((m.density & 3u) != 2u || !(m.empty_row & 0x40u)) return 0;
    constexpr double caps[] = {0.5, 2, 30, 1e4};
    return caps[(m.density >> 2) & 3u];
}

// The case's additive bias and ALiBi slopes (SdpaOptions::bias, alibi_slopes), from the same spare bits: bits 0-1
// equal to 11 and bit 7 of the empty-row byte set turn them on, an eighth of the inputs (never with a window or a
// cap); bits 2-3 pick an explicit bias (01), ALiBi (10) or both (00, 11). No saved finding of regressions/fuzz has
// that pattern with that bit, so each still decodes its own case. Where on, the bias's shape and layout and the
// slopes' shape come from the bytes after the mask spec, the values after the mask's bits (make_bias, make_slopes).
struct BiasSpec {
    bool bias = false, alibi = false;
    Shape bias_shape, slopes_shape;
    Layout bias_layout;
};

inline BiasSpec decode_bias_spec(FuzzedDataProvider& in, const MaskSpec& m, const Dims& dims) {
    BiasSpec b;
    if ((m.density & 3u) != 3u || !(m.empty_row & 0x80u)) return b;
    const unsigned pick = (m.density >> 2) & 3u;
    b.bias = pick != 2u;
    b.alibi = pick != 1u;
    if (b.bias) {
        b.bias_shape = broadcastable_shape(in, dims.scores(), 2);
        b.bias_layout = Layout::decode(in);
    }
    if (b.alibi) b.slopes_shape = broadcastable_shape(in, dims.batch, 0);
    return b;
}

// The explicit bias: values from the case's value source, and -inf (a blocked key) at every p-th position in
// storage order, p from a byte: never, or 2 to 8.
template <class T>
Operand<T> make_bias(FuzzedDataProvider& in, ValueSource<T>& values, const BiasSpec& spec) {
    const unsigned period = in.ConsumeIntegral<std::uint8_t>() % 8u;
    Index n = 0;
    return make_operand<T>("bias", spec.bias_shape, spec.bias_layout, [&](Index) {
        const T x = values.next();
        return period != 0 && n++ % static_cast<Index>(period + 1) == 0 ? T(-std::numeric_limits<double>::infinity())
                                                                          : x;
    });
}

// ALiBi's slopes: the standard range (2^-8 to 1), 0, or anything the value source gives (NaN, huge, negative: a
// NaN slope or one whose largest term overflows is a ValueError whatever check_finite says).
template <class T>
Operand<T> make_slopes(FuzzedDataProvider& in, ValueSource<T>& values, const BiasSpec& spec) {
    return make_operand<T>("alibi_slopes", spec.slopes_shape, Layout{}, [&](Index) {
        constexpr double table[] = {0x1p-8, 0x1p-3, 0.5, 1, 0};
        const unsigned pick = in.ConsumeIntegral<std::uint8_t>() % 8u;
        return pick < 5 ? static_cast<T>(table[pick]) : values.next();
    });
}

// The bias and the slopes `spec` asks for (make_bias, make_slopes), made after the mask's bits and set on `options`
// (which then holds views of them: keep the operands alive while options is used).
template <class T>
struct BiasOperands {
    std::optional<Operand<T>> bias, slopes;
};

template <class T>
BiasOperands<T> make_bias_operands(FuzzedDataProvider& in, ValueSource<T>& values, const BiasSpec& spec,
                                   SdpaOptions& options) {
    BiasOperands<T> made;
    if (spec.bias) {
        made.bias = make_bias(in, values, spec);
        options.bias = made.bias->view;
    }
    if (spec.alibi) {
        made.slopes = make_slopes(in, values, spec);
        options.alibi_slopes = made.slopes->view;
    }
    return made;
}

// Builds the mask operand of `spec` with shape `shape` (the spec's, or a corrupted one). Random bits come from the
// input, eight per byte.
inline Operand<bool> make_mask(FuzzedDataProvider& in, const MaskSpec& spec, const Shape& shape) {
    const std::size_t r = shape.size();
    const Index Tq = r >= 2 ? shape[r - 2] : 1, Tk = r >= 1 ? shape[r - 1] : 1;
    const Index empty_row = Tq > 0 ? spec.empty_row % Tq : 0;
    std::uint8_t byte = 0;
    int left = 0;
    Layout layout = spec.layout;
    Operand<bool> op = make_operand<bool>("allowed_mask", shape, layout, [&](Index) { return false; });
    // Fill by logical index so the meaning does not depend on the layout.
    for_each_index(shape, [&](std::span<const Index> idx) {
        const Index i = r >= 2 ? idx[r - 2] : 0, j = r >= 1 ? idx[r - 1] : 0;
        bool allowed = true;
        switch (spec.kind) {
            case MaskKind::Causal: {
                // The causal rule written out here, not taken from the library.
                const Index TqFull = Tq, TkFull = Tk;
                allowed = spec.alignment == CausalAlignment::TopLeft ? j <= i : j <= i + TkFull - TqFull;
                break;
            }
            case MaskKind::AllBlocked: allowed = false; break;
            default: {
                if (left == 0) {
                    byte = in.ConsumeIntegral<std::uint8_t>();
                    left = 8;
                }
                // Density selects how many of the eight bits count: sparse or dense masks from one byte stream.
                const bool bit = (byte >> (--left)) & 1u;
                allowed = spec.density >= 192 ? (bit || (byte & 3u)) : spec.density < 64 ? (bit && (byte & 1u)) : bit;
                if (spec.kind == MaskKind::EmptyRow && i == empty_row) allowed = false;
                break;
            }
        }
        Index off = 0;
        for (std::size_t d = 0; d < r; ++d) off += idx[d] * op.view.strides()[d];
        op.storage[off] = allowed;
    });
    return op;
}

// The operands of one SDPA call in the order the backends and backward targets decode them: q, k and v (values in
// that order), then the mask's bits, then the bias and the slopes (set on `options`, which then holds views of them).
template <class T>
struct SdpaOperands {
    Operand<T> q, k, v;
    std::optional<Operand<bool>> mask;
    std::optional<TensorView<const bool>> allowed_mask;
    BiasOperands<T> additive;
};

template <class T>
SdpaOperands<T> make_sdpa_operands(FuzzedDataProvider& in, ValueSource<T>& values, const Shape& qs, const Shape& ks,
                                   const Shape& vs, const Layout& ql, const Layout& kl, const Layout& vl,
                                   const MaskSpec& spec, const BiasSpec& bias_spec, SdpaOptions& options) {
    const auto fill = [&](Index) { return values.next(); };
    SdpaOperands<T> made;
    made.q = make_operand<T>("q", qs, ql, fill);
    made.k = make_operand<T>("k", ks, kl, fill);
    made.v = make_operand<T>("v", vs, vl, fill);
    if (spec.kind != MaskKind::None) {
        made.mask = make_mask(in, spec, spec.shape);
        made.allowed_mask = made.mask->view;
    }
    made.additive = make_bias_operands(in, values, bias_spec, options);
    return made;
}

// ---------------------------------------------------------------------------------------------------------------
// Options.

inline SdpaOptions decode_options(FuzzedDataProvider& in, bool allow_threads) {
    SdpaOptions o;
    const auto b = in.ConsumeIntegral<std::uint8_t>();
    o.is_causal = b & 1u;
    o.alignment = (b & 2u) ? CausalAlignment::BottomRight : CausalAlignment::TopLeft;
    switch ((b >> 2) & 3u) {
        case 1: o.empty_rows = EmptyRowPolicy::Zero; break;
        case 2: o.empty_rows = EmptyRowPolicy::Nan; break;
        default: o.empty_rows = EmptyRowPolicy::Throw; break;
    }
    o.check_finite = !(b & 16u);
    o.return_weights = b & 32u;
    o.num_threads = allow_threads && (b & 64u) ? 2 : 1;
    // tiled never forms weights, and naming it while asking for them is a ConfigError (covered by the unit tests):
    // with weights the high bit selects Auto, which must then pick reference.
    o.backend = (b & 128u) ? (o.return_weights ? Backend::Auto : Backend::Tiled) : Backend::Reference;
    return o;
}

inline std::string describe(const SdpaOptions& o) {
    std::string s = std::string("policy=") + to_string(o.empty_rows);
    if (o.is_causal) s += std::string(",causal=") + to_string(o.alignment);
    if (o.window)
        s += ",window=" + std::to_string(o.window->left) + ":" + std::to_string(o.window->right) + ":" +
             to_string(o.window->alignment);
    if (o.scale) s += ",scale=" + std::to_string(*o.scale);
    if (o.softcap != 0) s += ",softcap=" + std::to_string(o.softcap);
    if (o.bias) s += ",bias=" + to_string(o.bias->shape());
    if (o.alibi_slopes) s += ",alibi=" + to_string(o.alibi_slopes->shape());
    if (!o.check_finite) s += ",check_finite=0";
    if (o.return_weights) s += ",weights=1";
    if (o.num_threads != 1) s += ",threads=" + std::to_string(o.num_threads);
    s += std::string(",backend=") + to_string(o.backend);
    return s;
}

// ---------------------------------------------------------------------------------------------------------------
// The model: which keys each query may read, computed from the broadcast mask and the causal rule written out
// here. Used to predict errors and empty rows, and to find the inputs a backend must look at.

// Multi-index of flat batch index b, followed by (i, j).
inline Shape batch_index(const Shape& batch, Index b, Index i, Index j) {
    Shape idx(batch.size() + 2, 0);
    for (std::size_t d = batch.size(); d-- > 0;) {
        idx[d] = b % batch[d];
        b /= batch[d];
    }
    idx[batch.size()] = i;
    idx[batch.size() + 1] = j;
    return idx;
}

struct AllowedModel {
    Shape batch;
    Index batch_count = 1, Tq = 0, Tk = 0;
    std::vector<char> allowed;  // [batch_count][Tq][Tk]
    std::vector<char> row_nonempty;  // [batch_count][Tq]
    // The additive bias: a row reads a NaN or +inf bias ([batch_count][Tq], 1 when not); the largest |bias| a query
    // reads plus ALiBi's largest |term|; a slope ALiBi refuses (NaN, or slope * max(Tq - 1, Tk - 1) not finite).
    std::vector<char> row_bias_finite;
    long double max_abs_additive = 0;
    bool slopes_refused = false;

    bool at(Index b, Index i, Index j) const { return allowed[static_cast<std::size_t>((b * Tq + i) * Tk + j)]; }
    bool nonempty(Index b, Index i) const { return row_nonempty[static_cast<std::size_t>(b * Tq + i)]; }
    bool any_empty_row() const {
        for (char c : row_nonempty)
            if (!c) return true;
        return false;
    }
};

// bias and slopes (when given) are the explicit bias and ALiBi's slopes as decoded, broadcast here to the scores and
// the batch: a -inf bias blocks its key.
template <class T = double>
AllowedModel model_allowed(const Shape& batch, Index Tq, Index Tk, const TensorView<const bool>* allowed_mask,
                           const SdpaOptions& o, const TensorView<const T>* bias = nullptr,
                           const TensorView<const T>* slopes = nullptr) {
    AllowedModel m;
    m.batch = batch;
    m.batch_count = numel(batch);
    m.Tq = Tq;
    m.Tk = Tk;
    m.allowed.assign(static_cast<std::size_t>(m.batch_count * Tq * Tk), 0);
    m.row_nonempty.assign(static_cast<std::size_t>(m.batch_count * Tq), 0);
    m.row_bias_finite.assign(static_cast<std::size_t>(m.batch_count * Tq), 1);
    Shape scores = batch;
    scores.push_back(Tq);
    scores.push_back(Tk);
    Index n = 0;
    for_each_index(scores, [&](std::span<const Index> idx) {
        const Index i = idx[idx.size() - 2], j = idx[idx.size() - 1];
        bool a = true;
        if (o.is_causal) a = o.alignment == CausalAlignment::TopLeft ? j <= i : j <= i + Tk - Tq;
        if (a && o.window) {  // FlashAttention's (bottom-right) or JAX's (top-left) band, written out here too
            const Index d = o.window->alignment == CausalAlignment::TopLeft ? i : i + Tk - Tq;
            a = (o.window->left < 0 || j >= d - o.window->left) && (o.window->right < 0 || j <= d + o.window->right);
        }
        if (a && allowed_mask) a = broadcast_get(*allowed_mask, scores, idx);
        if (a && bias) {
            const long double x = static_cast<long double>(broadcast_get(*bias, scores, idx));
            if (x == -std::numeric_limits<long double>::infinity()) a = false;
            else if (!std::isfinite(x)) m.row_bias_finite[static_cast<std::size_t>(n / Tk)] = 0;
            else m.max_abs_additive = std::max(m.max_abs_additive, std::fabs(x));
        }
        m.allowed[static_cast<std::size_t>(n)] = a;
        if (a) m.row_nonempty[static_cast<std::size_t>(n / Tk)] = 1;
        ++n;
    });
    if (slopes) {  // in the compute type, as the library checks them
        using C = compute_t<T>;
        const C far = static_cast<C>(std::max<Index>({Tk - 1, Tq - 1, 0}));
        long double largest = 0;
        for (Index b = 0; b < m.batch_count; ++b) {
            const Shape idx = batch_index(batch, b, 0, 0);
            const C slope = static_cast<C>(broadcast_get(*slopes, batch, std::span<const Index>(idx.data(), batch.size())));
            if (!std::isfinite(slope) || !std::isfinite(slope * far)) m.slopes_refused = true;
            else largest = std::max(largest, std::fabs(static_cast<long double>(slope) * far));
        }
        m.max_abs_additive += largest;
    }
    return m;
}

// What the model knows of the inputs a query row reads: whether all are finite, and magnitudes for deciding
// whether an overflow is possible.
struct ReadSummary {
    bool all_finite = true;
    std::vector<char> row_finite;  // [batch_count][Tq]: everything query row i of batch b may read is finite
    long double max_abs_dot = 0;  // max over allowed (b, i, j) of sum_d |q_id| |k_jd|
    long double max_abs_v = 0;    // max |v_jd| over readable j
    long double max_abs_additive = 0;  // AllowedModel::max_abs_additive: the bias and ALiBi's term
};

// Offset of batch element b (flat, C order over `batch`) in a view whose leading dims broadcast to `batch`.
template <class T>
Index batch_offset(const TensorView<const T>& view, const Shape& batch, Index b) {
    const std::size_t r = static_cast<std::size_t>(view.rank()) - 2, shift = batch.size() - r;
    Index off = 0;
    for (std::size_t d = batch.size(); d-- > 0;) {
        const Index i = b % batch[d];
        b /= batch[d];
        if (d >= shift && view.shape()[d - shift] != 1) off += i * view.strides()[d - shift];
    }
    return off;
}

template <class T>
ReadSummary summarise_reads(const AllowedModel& m, const TensorView<const T>& q, const TensorView<const T>& k,
                            const TensorView<const T>& v) {
    ReadSummary s;
    const Index Dk = q.dim(-1), Dv = v.dim(-1);
    const auto at = [](const TensorView<const T>& t, Index base, Index row, Index col) {
        return t.data()[base + row * t.stride(-2) + col * t.stride(-1)];
    };
    s.row_finite.assign(static_cast<std::size_t>(m.batch_count * m.Tq), 1);
    for (Index b = 0; b < m.batch_count; ++b) {
        const Index qb = batch_offset(q, m.batch, b), kb = batch_offset(k, m.batch, b), vb = batch_offset(v, m.batch, b);
        for (Index i = 0; i < m.Tq; ++i) {
            if (!m.nonempty(b, i)) continue;
            char& row_finite = s.row_finite[static_cast<std::size_t>(b * m.Tq + i)];
            for (Index d = 0; d < Dk; ++d)
                if (!std::isfinite(at(q, qb, i, d))) row_finite = 0;
            for (Index j = 0; j < m.Tk; ++j) {
                if (!m.at(b, i, j)) continue;
                long double dot = 0;
                for (Index d = 0; d < Dk; ++d) {
                    const T kd = at(k, kb, j, d);
                    if (!std::isfinite(kd)) row_finite = 0;
                    dot += std::fabs(static_cast<long double>(at(q, qb, i, d))) * std::fabs(static_cast<long double>(kd));
                }
                if (std::isfinite(dot)) s.max_abs_dot = std::max(s.max_abs_dot, dot);
                for (Index d = 0; d < Dv; ++d) {
                    const T vd = at(v, vb, j, d);
                    if (!std::isfinite(vd)) row_finite = 0;
                    else s.max_abs_v = std::max(s.max_abs_v, std::fabs(static_cast<long double>(vd)));
                }
            }
            if (!m.row_bias_finite[static_cast<std::size_t>(b * m.Tq + i)]) row_finite = 0;
            if (!row_finite) s.all_finite = false;
        }
    }
    s.max_abs_additive = m.max_abs_additive;
    return s;
}

// Whether finite inputs may legitimately overflow in dtype T: a logit scale * q.k (or the unscaled dot product a
// gemm may form first) plus its bias, or a value, reaches a quarter of T's max. Below that, a convex combination of
// the values and a sum of Dk products with |.| < max/4 stay finite in any summation order (relative rounding error
// <= Dk u < 1).
// 16-bit storage computes in float, and its results cannot overflow when rounded (a convex combination of 16-bit
// values): float's limit is the one.
template <class T>
bool overflow_possible(const ReadSummary& s, double scale) {
    const long double limit = static_cast<long double>(std::numeric_limits<compute_t<T>>::max()) / 4;
    const long double logit =
        s.max_abs_dot * std::max<long double>(1, std::fabs(static_cast<long double>(scale))) + s.max_abs_additive;
    return logit >= limit || s.max_abs_v >= limit;
}

// Same shape and the same bits (NaN payloads and signed zeros included): the claim of every "bitwise" property.
template <class T>
bool bitwise_equal(const Tensor<T>& a, const Tensor<T>& b) {
    return a.shape() == b.shape() &&
           std::memcmp(a.data(), b.data(), static_cast<std::size_t>(a.numel()) * sizeof(T)) == 0;
}

// The outcome of a call: a result (SdpaResult or MhaResult), or the documented error's kind and message. Anything
// thrown that is not an attn::Error is a finding.
template <class R>
struct Outcome {
    std::optional<R> result;
    std::string kind, message;
};

template <class R, class F>
Outcome<R> attempt(F&& f) {
    Outcome<R> o;
    try {
        o.result = f();
    } catch (const ShapeError& e) {
        o.kind = "ShapeError", o.message = e.what();
    } catch (const MaskError& e) {
        o.kind = "MaskError", o.message = e.what();
    } catch (const ValueError& e) {
        o.kind = "ValueError", o.message = e.what();
    } catch (const ConfigError& e) {
        o.kind = "ConfigError", o.message = e.what();
    } catch (const Error& e) {
        o.kind = "Error", o.message = e.what();
    } catch (const std::exception& e) {
        fail(__FILE__, __LINE__, std::string("an exception outside attn::Error: ") + e.what());
    }
    return o;
}

// The same error kind, or results with bitwise the same output and weights.
template <class R>
void same_outcome(const Outcome<R>& a, const Outcome<R>& b, const std::string& what) {
    ATTN_FUZZ_REQUIRE(a.kind == b.kind, what + ": '" + a.kind + "' (" + a.message + ") vs '" + b.kind + "' (" +
                                            b.message + ")");
    if (!a.result) return;
    ATTN_FUZZ_REQUIRE(bitwise_equal(a.result->output, b.result->output), what + ": outputs differ in their bits");
    ATTN_FUZZ_REQUIRE(a.result->weights.has_value() == b.result->weights.has_value(), what + ": weights returned by one only");
    if (a.result->weights)
        ATTN_FUZZ_REQUIRE(bitwise_equal(*a.result->weights, *b.result->weights), what + ": weights differ in their bits");
}

}  // namespace attn::fuzz
