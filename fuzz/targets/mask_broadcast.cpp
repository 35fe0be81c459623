// Fuzz target `mask_broadcast`: a broadcastable allowed mask (fewer dims, size-1 dims, stride-0 views, transposed
// storage) gives bitwise the output of its expanded contiguous copy; a non-broadcastable one is a clean ShapeError
// naming both shapes. Also checks logical_and and the blocked/allowed adapters against the model's broadcasting.
#include <cstring>

#include "../candidate.hpp"
#include "../decode.hpp"

namespace attn::fuzz {
namespace {

template <class T>
Outcome<SdpaResult<T>> call(const Operand<T>& q, const Operand<T>& k, const Operand<T>& v,
                            TensorView<const bool> allowed_mask, const SdpaOptions& options) {
    return attempt<SdpaResult<T>>([&] { return run_candidate<T>(q.view, k.view, v.view, allowed_mask, options); });
}

// The mask's storage seen as a view of the full scores shape with stride 0 along every broadcast dim: the same
// mask, written the way a caller who expands without copying would write it.
TensorView<const bool> stretched(const TensorView<const bool>& m, const Shape& scores) {
    Shape strides(scores.size(), 0);
    const std::size_t shift = scores.size() - static_cast<std::size_t>(m.rank());
    for (std::size_t d = 0; d < static_cast<std::size_t>(m.rank()); ++d)
        strides[shift + d] = m.shape()[d] == 1 ? 0 : m.strides()[d];
    return TensorView<const bool>(m.data(), scores, strides);
}

template <class T>
void run_broadcast(FuzzedDataProvider& in) {
    const Dims dims = Dims::decode(in, 6, 4);
    SdpaOptions options = decode_options(in, false);
    options.check_finite = true;
    MaskSpec spec = decode_mask_spec(in, dims);
    if (spec.kind == MaskKind::None) spec.kind = MaskKind::Random, spec.shape = dims.scores();
    const bool corrupt = in.ConsumeIntegral<std::uint8_t>() >= 200;
    const auto fault_pick = in.ConsumeIntegral<std::uint8_t>();
    const Shape scores = dims.scores();
    Shape mask_shape = spec.shape;
    if (corrupt) {
        if (fault_pick & 1u) {  // more dims than the scores
            while (mask_shape.size() <= scores.size()) mask_shape.insert(mask_shape.begin(), 2);
        } else {  // one dim neither 1 nor the scores' extent
            const std::size_t d = (fault_pick >> 1) % mask_shape.size();
            const Index target = scores[scores.size() - mask_shape.size() + d];
            mask_shape[d] = target == 0 ? 2 : target + 1;
        }
    }
    ValueSource<T> values(in, ValueProfile{});
    const auto fill = [&](Index) { return values.next(); };
    Shape qs = dims.batch, ks = dims.batch, vs = dims.batch;
    qs.insert(qs.end(), {dims.Tq, dims.Dk});
    ks.insert(ks.end(), {dims.Tk, dims.Dk});
    vs.insert(vs.end(), {dims.Tk, dims.Dv});
    const Operand<T> q = make_operand<T>("q", qs, Layout{}, fill);
    const Operand<T> k = make_operand<T>("k", ks, Layout{}, fill);
    const Operand<T> v = make_operand<T>("v", vs, Layout{}, fill);
    const Operand<bool> mask = make_mask(in, spec, mask_shape);
    current_config() = std::string("mask_broadcast(dtype=") + (std::is_same_v<T, float> ? "float" : "double") + "," +
                       dims.describe() + ",mask=" + kind_name(spec.kind) + to_string(mask_shape) +
                       spec.layout.describe() + (corrupt ? ",corrupt" : "") + "," + describe(options) +
                       ",impl=" + candidate_name() + ")";

    if (corrupt) {
        // Both shapes named, by sdpa and by broadcast_allowed_mask itself.
        const Outcome<SdpaResult<T>> got = call<T>(q, k, v, mask.view, options);
        ATTN_FUZZ_REQUIRE(got.kind == "ShapeError", "a non-broadcastable mask gave '" + got.kind + "' " + got.message);
        if (candidate_is_library())
            ATTN_FUZZ_REQUIRE(contains(got.message, to_string(mask_shape)) && contains(got.message, to_string(scores)) &&
                                  got.message.rfind("sdpa: ", 0) == 0,
                              "the message does not name both shapes: " + got.message);
        try {
            (void)broadcast_allowed_mask(mask.view, scores, "fuzz");
            fail(__FILE__, __LINE__, "broadcast_allowed_mask accepted " + to_string(mask_shape) + " for " + to_string(scores));
        } catch (const ShapeError& e) {
            const std::string message = e.what();
            ATTN_FUZZ_REQUIRE(contains(message, to_string(mask_shape)) && contains(message, to_string(scores)) &&
                                  message.rfind("fuzz: ", 0) == 0,
                              "broadcast_allowed_mask's message does not name both shapes: " + message);
        }
        return;
    }

    // The same mask three ways: as decoded (fewer dims, size-1 dims, chosen layout), stretched with stride 0 to the
    // full shape, and expanded to a contiguous copy by the model.
    const Tensor<bool> expanded = expand(mask.view, scores);
    const Outcome<SdpaResult<T>> reference = call<T>(q, k, v, expanded.view(), options);
    same_outcome(call<T>(q, k, v, mask.view, options), reference, "broadcast mask vs its expanded copy");
    same_outcome(call<T>(q, k, v, stretched(mask.view, scores), options), reference,
                 "stride-0 mask vs its expanded copy");
    ATTN_FUZZ_REQUIRE(reference.result || reference.kind == "MaskError",
                      "a valid mask gave '" + reference.kind + "' " + reference.message);
}

// logical_and(a, b) has the broadcast shape and the model's elementwise and; a pair that does not broadcast is a
// ShapeError naming both shapes. blocked_to_allowed inverts every element.
void run_logical(FuzzedDataProvider& in) {
    const Dims dims = Dims::decode(in, 5, 1);
    const Shape scores = dims.scores();
    MaskSpec sa = decode_mask_spec(in, dims), sb = decode_mask_spec(in, dims);
    if (sa.kind == MaskKind::None) sa.kind = MaskKind::Random, sa.shape = scores;
    if (sb.kind == MaskKind::None) sb.kind = MaskKind::Random, sb.shape = broadcastable_shape(in, scores, 0);
    if (in.ConsumeIntegral<std::uint8_t>() >= 224 && !sb.shape.empty()) {
        Index& d = sb.shape[0];
        const Index other = sa.shape.size() >= sb.shape.size() ? sa.shape[sa.shape.size() - sb.shape.size()] : 1;
        d = other == 1 ? d : other + 1;
    }
    const Operand<bool> a = make_mask(in, sa, sa.shape), b = make_mask(in, sb, sb.shape);
    current_config() = "mask_broadcast(logical_and," + to_string(sa.shape) + sa.layout.describe() + "," +
                       to_string(sb.shape) + sb.layout.describe() + ")";
    const std::optional<Shape> shape = broadcast_model(sa.shape, sb.shape);
    try {
        const Tensor<bool> both = logical_and(a.view, b.view);
        ATTN_FUZZ_REQUIRE(shape.has_value(), "logical_and accepted shapes that do not broadcast");
        ATTN_FUZZ_REQUIRE(both.shape() == *shape, "logical_and gave shape " + to_string(both.shape()));
        Index n = 0;
        for_each_index(*shape, [&](std::span<const Index> idx) {
            const bool expected = broadcast_get(a.view, *shape, idx) && broadcast_get(b.view, *shape, idx);
            ATTN_FUZZ_REQUIRE(both[n] == expected, "logical_and wrong at flat index " + std::to_string(n));
            ++n;
        });
    } catch (const ShapeError& e) {
        const std::string message = e.what();
        ATTN_FUZZ_REQUIRE(!shape.has_value(), "logical_and rejected broadcastable shapes: " + message);
        ATTN_FUZZ_REQUIRE(contains(message, to_string(sa.shape)) && contains(message, to_string(sb.shape)) &&
                              message.rfind("logical_and: ", 0) == 0,
                          "the message does not name both shapes: " + message);
    }
    const Tensor<bool> allowed = blocked_to_allowed(a.view);
    const Tensor<bool> round_trip = allowed_to_blocked(allowed.view());
    Index n = 0;
    for_each_index(sa.shape, [&](std::span<const Index> idx) {
        const bool blocked = a.view.at(idx);
        ATTN_FUZZ_REQUIRE(allowed[n] == !blocked && round_trip[n] == blocked,
                          "blocked/allowed adapters wrong at flat index " + std::to_string(n));
        ++n;
    });
}

}  // namespace
}  // namespace attn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    FuzzedDataProvider in(data, size);
    switch (in.ConsumeIntegralInRange<int>(0, 4)) {
        case 0: attn::fuzz::run_logical(in); break;
        case 1: attn::fuzz::run_broadcast<double>(in); break;
        default: attn::fuzz::run_broadcast<float>(in); break;
    }
    return 0;
}
