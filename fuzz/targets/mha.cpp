// Fuzz target `mha`: MultiHeadAttention configurations (heads, kv heads, kdim/vdim, biases, masks in both
// conventions, key padding, causal, weights per head or averaged) and the module's head path:
//   - the head path (mha_sdpa_path, GQA included) gives bitwise the head-split computation: SDPA over (B, H) with
//     each query head reading kv head h / (H/G), expanded here; on small cases it is within the oracle's bound;
//   - the module: forward == forward_blocked with the negated masks == the masks as float masks of 0 and -inf
//     (MhaOptions::bias, key_padding_bias) == forward_cross / forward_self where they apply (bitwise); the
//     predicted error kind; finite outputs from finite inputs; head-averaged weights are the
//     mean of the per-head weights within (H + 1) u (plus one rounding on 16-bit storage).
// Float cases run in float16 or bfloat16 too (a quarter of them), like the sdpa target's.
#include <cstring>

#include "../candidate.hpp"
#include "../decode.hpp"
#include "attn/detail/mha_sdpa_path.hpp"  // test glue, internal

namespace attn::fuzz {
namespace {

void require_named(const std::string& message, const std::string& function) {
    ATTN_FUZZ_REQUIRE(message.rfind(function + ": ", 0) == 0, "the message does not name " + function + ": " + message);
}

// Copy of x (B?, G, T, D) expanded to (B, H, T, D): query head h reads kv head h / (H / G).
template <class T>
Tensor<T> expand_heads(const TensorView<const T>& x, Index B, Index H) {
    const Index G = x.dim(1), T_ = x.dim(2), D = x.dim(3);
    Tensor<T> out({B, H, T_, D});
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index t = 0; t < T_; ++t)
                for (Index d = 0; d < D; ++d)
                    out[((b * H + h) * T_ + t) * D + d] = x({x.dim(0) == 1 ? 0 : b, h / (H / G), t, d});
    return out;
}

// The sizes of a head-path case, read before its dtype is known (the profile byte, the last of them, chooses it).
struct HeadPathSizes {
    Index B, Tq, Tk, Dk, Dv, G, H;
    bool k_batch_broadcast, v_batch_broadcast;
    std::uint8_t profile_bits;
    static HeadPathSizes decode(FuzzedDataProvider& in) {
        HeadPathSizes s{};
        s.B = 1 + in.ConsumeIntegralInRange<Index>(0, 1);
        s.Tq = 1 + in.ConsumeIntegralInRange<Index>(0, 5);
        s.Tk = 1 + in.ConsumeIntegralInRange<Index>(0, 5);
        s.Dk = 1 + in.ConsumeIntegralInRange<Index>(0, 3);
        s.Dv = 1 + in.ConsumeIntegralInRange<Index>(0, 3);
        s.G = 1 + in.ConsumeIntegralInRange<Index>(0, 2);
        s.H = s.G * (1 + in.ConsumeIntegralInRange<Index>(0, 2));
        s.k_batch_broadcast = in.ConsumeBool();
        s.v_batch_broadcast = in.ConsumeBool();
        s.profile_bits = in.ConsumeIntegral<std::uint8_t>();
        return s;
    }
};

// The head path against the head-split computation and the oracle.
template <class T>
void run_head_path(FuzzedDataProvider& in, const HeadPathSizes& sizes) {
    const Index B = sizes.B, Tq = sizes.Tq, Tk = sizes.Tk, Dk = sizes.Dk, Dv = sizes.Dv, G = sizes.G, H = sizes.H;
    const bool k_batch_broadcast = sizes.k_batch_broadcast, v_batch_broadcast = sizes.v_batch_broadcast;
    const auto profile_bits = sizes.profile_bits;
    const ValueProfile profile{(profile_bits & 3u) == 3u, false};
    SdpaOptions options = decode_options(in, false);
    const Dims dims{{B, H}, Tq, Tk, Dk, Dv};
    const MaskSpec spec = decode_mask_spec(in, dims);
    // An additive bias and ALiBi slopes on the same eighth of the inputs as in the sdpa target (decode_bias_spec):
    // the module's head path takes them as MhaOptions::bias and alibi_slopes.
    const BiasSpec bias_spec = decode_bias_spec(in, spec, dims);
    ValueSource<T> values(in, profile);
    const auto fill = [&](Index) { return values.next(); };
    const Operand<T> q = make_operand<T>("q", {B, H, Tq, Dk}, Layout{}, fill);
    const Operand<T> k = make_operand<T>("k", {k_batch_broadcast ? 1 : B, G, Tk, Dk}, Layout{}, fill);
    const Operand<T> v = make_operand<T>("v", {v_batch_broadcast ? 1 : B, G, Tk, Dv}, Layout{}, fill);
    std::optional<Operand<bool>> mask;
    std::optional<TensorView<const bool>> allowed_mask;
    if (spec.kind != MaskKind::None) {
        mask = make_mask(in, spec, spec.shape);
        allowed_mask = mask->view;
    }
    const BiasOperands<T> additive = make_bias_operands(in, values, bias_spec, options);
    current_config() = std::string("mha(head_path,dtype=") + dtype_name<T>() +
                       ",B=" + std::to_string(B) + ",H=" + std::to_string(H) + ",G=" + std::to_string(G) + ",Tq=" +
                       std::to_string(Tq) + ",Tk=" + std::to_string(Tk) + ",Dk=" + std::to_string(Dk) + ",Dv=" +
                       std::to_string(Dv) + ",mask=" + kind_name(spec.kind) + (mask ? to_string(spec.shape) : "") +
                       (additive.bias ? ",bias=" + to_string(bias_spec.bias_shape) : "") +
                       (additive.slopes ? ",alibi_slopes=" + to_string(bias_spec.slopes_shape) : "") + "," +
                       describe(options) + ")";

    const Tensor<T> k_heads = expand_heads(k.view, B, H), v_heads = expand_heads(v.view, B, H);
    const auto path = attempt<SdpaResult<T>>([&] { return detail::mha_sdpa_path(q.view, k.view, v.view, allowed_mask, options); });
    const auto split = attempt<SdpaResult<T>>(
        [&] { return scaled_dot_product_attention(q.view, k_heads.view(), v_heads.view(), allowed_mask, options); });
    same_outcome(path, split, "head path vs SDPA over (B, H) with kv heads expanded");
    if (!path.result) {
        // Errors found past validation come from the module's path and name it (multi_head_sdpa, with the projected
        // shapes, or sdpa for an overflow in the core); noted for the module's owners, accepted here so the fuzzer keeps looking for wrong numbers.
        const bool inner = path.message.rfind("multi_head_sdpa: ", 0) == 0 ||
                           (path.message.rfind("sdpa: ", 0) == 0 && contains(path.message, "overflowed"));
        if (!inner) require_named(path.message, "mha_sdpa_path");
        return;
    }
#if ATTN_FUZZ_HAVE_ORACLE
    const AllowedModel model = model_allowed({B, H}, Tq, Tk, mask ? &mask->view : nullptr, options,
                                             additive.bias ? &additive.bias->view : nullptr,
                                             additive.slopes ? &additive.slopes->view : nullptr);
    const ReadSummary reads = summarise_reads(model, q.view, k_heads.view(), v_heads.view());
    const double scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(Dk));
    if (reads.all_finite && !overflow_possible<T>(reads, scale) && small_enough_for_oracle(B * H, Tq, Tk, Dk, Dv))
        require_within_oracle_bound<T>(*path.result, q.view, k_heads.view(), v_heads.view(), allowed_mask, options);
#endif
}

// The configuration of a module case, read before its dtype is known (the profile byte, the last, chooses it).
struct ModuleSizes {
    Index B, Tq, Tk, H;
    MhaConfig config;
    std::uint8_t profile_bits;
    static ModuleSizes decode(FuzzedDataProvider& in) {
        ModuleSizes s{};
        s.B = 1 + in.ConsumeIntegralInRange<Index>(0, 1);
        s.Tq = 1 + in.ConsumeIntegralInRange<Index>(0, 4);
        s.Tk = 1 + in.ConsumeIntegralInRange<Index>(0, 4);
        MhaConfig& config = s.config;
        const Index G = 1 + in.ConsumeIntegralInRange<Index>(0, 1), H = G * (1 + in.ConsumeIntegralInRange<Index>(0, 2)),
                    Dh = 1 + in.ConsumeIntegralInRange<Index>(0, 2);
        s.H = H;
        config.num_heads = H;
        config.embed_dim = H * Dh;
        if (in.ConsumeBool()) config.num_kv_heads = G;
        if (in.ConsumeBool()) config.kdim = 1 + in.ConsumeIntegralInRange<Index>(0, 4);
        if (in.ConsumeBool()) config.vdim = 1 + in.ConsumeIntegralInRange<Index>(0, 4);
        config.bias = in.ConsumeBool();
        config.init_seed = in.ConsumeIntegral<std::uint8_t>();
        const auto fault = in.ConsumeIntegral<std::uint8_t>();
        if (fault >= 248) config.embed_dim += 1;             // E % H != 0 (unless H = 1)
        else if (fault >= 244) config.num_kv_heads = H + 1;  // H % G != 0
        else if (fault >= 240) config.kdim = 0;              // a size < 1
        s.profile_bits = in.ConsumeIntegral<std::uint8_t>();
        return s;
    }
};

// The module: conventions, entry points, errors, finite outputs, averaged weights.
template <class T>
void run_module(FuzzedDataProvider& in, const ModuleSizes& sizes) {
    const Index B = sizes.B, Tq = sizes.Tq, Tk = sizes.Tk, H = sizes.H;
    MhaConfig config = sizes.config;
    const Index E = config.embed_dim, kdim = config.kdim.value_or(E), vdim = config.vdim.value_or(E);
    const auto profile_bits = sizes.profile_bits;
    const ValueProfile profile{(profile_bits & 3u) == 3u, false};
    MhaOptions options;
    const SdpaOptions sdpa_options = decode_options(in, false);
    options.is_causal = sdpa_options.is_causal;
    options.alignment = sdpa_options.alignment;
    options.empty_rows = sdpa_options.empty_rows;
    options.check_finite = sdpa_options.check_finite;
    options.num_threads = 1;
    options.weights = static_cast<MhaWeights>(in.ConsumeIntegralInRange<int>(0, 2));
    // Masks: none, (Tq, Tk), (B, Tq, Tk) or 4-D broadcastable to (B, H, Tq, Tk); key padding (B, Tk) or none.
    const int mask_rank = in.ConsumeIntegralInRange<int>(0, 3);
    const bool padding = in.ConsumeBool();
    Shape mask_shape;
    if (mask_rank == 1) mask_shape = {Tq, Tk};
    if (mask_rank == 2) mask_shape = {B, Tq, Tk};
    if (mask_rank == 3) mask_shape = broadcastable_shape(in, {B, H, Tq, Tk}, 4);
    MaskSpec spec = decode_mask_spec(in, Dims{{B, H}, Tq, Tk, 1, 1});
    if (spec.kind == MaskKind::None) spec.kind = MaskKind::Random;

    std::optional<MultiHeadAttention<T>> module;
    try {
        module.emplace(config);
    } catch (const ConfigError& e) {
        const bool bad = config.embed_dim % H != 0 || (config.num_kv_heads && H % *config.num_kv_heads != 0) || kdim < 1;
        ATTN_FUZZ_REQUIRE(bad, std::string("a valid configuration was refused: ") + e.what());
        require_named(e.what(), "MultiHeadAttention");
        return;
    }
    ATTN_FUZZ_REQUIRE(config.embed_dim % H == 0 && kdim >= 1 && (!config.num_kv_heads || H % *config.num_kv_heads == 0),
                      "an impossible configuration was accepted");

    ValueSource<T> values(in, profile);
    const auto fill = [&](Index) { return values.next(); };
    const Operand<T> x = make_operand<T>("query_states", {B, Tq, E}, Layout{}, fill);
    const Operand<T> mem_k = make_operand<T>("key_states", {B, Tk, kdim}, Layout{}, fill);
    const Operand<T> mem_v = make_operand<T>("value_states", {B, Tk, vdim}, Layout{}, fill);
    std::optional<Operand<bool>> mask, pad;
    std::optional<TensorView<const bool>> allowed_mask;
    if (mask_rank > 0) {
        mask = make_mask(in, spec, mask_shape);
        allowed_mask = mask->view;
    }
    if (padding) {
        MaskSpec pad_spec;
        pad_spec.kind = MaskKind::Random;
        pad_spec.density = spec.density;
        pad = make_mask(in, pad_spec, {B, Tk});
        options.key_padding_allowed = pad->view;
    }
    current_config() = std::string("mha(module,dtype=") + dtype_name<T>() + ",B=" +
                       std::to_string(B) + ",Tq=" + std::to_string(Tq) + ",Tk=" + std::to_string(Tk) + ",E=" +
                       std::to_string(E) + ",H=" + std::to_string(H) + ",G=" + std::to_string(module->num_kv_heads()) +
                       ",kdim=" + std::to_string(kdim) + ",vdim=" + std::to_string(vdim) + ",bias=" +
                       std::to_string(config.bias) + ",mask=" + (mask ? to_string(mask_shape) : "none") +
                       (padding ? ",padding" : "") + ",weights=" + std::to_string(static_cast<int>(options.weights)) +
                       "," + describe(sdpa_options) + ")";

    const auto allowed_run = attempt<MhaResult<T>>(
        [&] { return module->forward(x.view, mem_k.view, mem_v.view, allowed_mask, options); });

    // The same masks in the blocked convention give the same bits.
    std::optional<Tensor<bool>> blocked, pad_blocked;
    if (mask) blocked = allowed_to_blocked(mask->view);
    if (pad) pad_blocked = allowed_to_blocked(pad->view);
    MhaOptions blocked_options = options;
    blocked_options.key_padding_allowed.reset();
    const auto blocked_run = attempt<MhaResult<T>>([&] {
        return module->forward_blocked(
            x.view, mem_k.view, mem_v.view,
            blocked ? std::optional<TensorView<const bool>>(blocked->view()) : std::nullopt,
            pad_blocked ? std::optional<TensorView<const bool>>(pad_blocked->view()) : std::nullopt, blocked_options);
    });
    same_outcome(allowed_run, blocked_run, "allowed masks vs the same masks blocked");
    // PyTorch's float masks: the same masks as MhaOptions::bias and key_padding_bias of 0 (allowed) and -inf
    // (blocked) give the same bits (a -inf blocks its key exactly as a false; adding 0 is exact).
    if (mask || pad) {
        std::optional<Tensor<T>> float_mask, float_pad;
        const auto to_float = [](TensorView<const bool> m) {
            const Tensor<bool> dense = Tensor<bool>::copy_of(m);
            Tensor<T> f(dense.shape());
            for (Index n = 0; n < f.numel(); ++n) f[n] = dense[n] ? T(0) : T(-std::numeric_limits<float>::infinity());
            return f;
        };
        MhaOptions float_options = options;
        float_options.key_padding_allowed.reset();
        if (mask) float_mask = to_float(mask->view), float_options.bias = FloatView(float_mask->view());
        if (pad) float_pad = to_float(pad->view), float_options.key_padding_bias = FloatView(float_pad->view());
        const auto float_run = attempt<MhaResult<T>>(
            [&] { return module->forward(x.view, mem_k.view, mem_v.view, std::nullopt, float_options); });
        same_outcome(allowed_run, float_run, "bool masks vs the same masks as float masks of 0 and -inf");
    }
    if (kdim == vdim) {
        const auto cross = attempt<MhaResult<T>>(
            [&] { return module->forward_cross(x.view, mem_k.view, allowed_mask, options); });
        const auto plain = attempt<MhaResult<T>>(
            [&] { return module->forward(x.view, mem_k.view, mem_k.view, allowed_mask, options); });
        same_outcome(cross, plain, "forward_cross(q, m) vs forward(q, m, m)");
    }

    // Which rows are empty: the masks combined here into (B, H, Tq, Tk).
    Tensor<bool> combined({B, H, Tq, Tk}, true);
    for (Index b = 0; b < B; ++b)
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j) {
                    bool a = true;
                    if (mask_rank == 1) a = mask->view({i, j});
                    if (mask_rank == 2) a = mask->view({b, i, j});
                    if (mask_rank == 3) a = broadcast_get(mask->view, {B, H, Tq, Tk}, std::vector<Index>{b, h, i, j});
                    if (pad) a = a && pad->view({b, j});
                    combined[((b * H + h) * Tq + i) * Tk + j] = a;
                }
    SdpaOptions causal_only;
    causal_only.is_causal = options.is_causal;
    causal_only.alignment = options.alignment;
    const TensorView<const bool> combined_view = combined.view();
    const AllowedModel model = model_allowed({B, H}, Tq, Tk, &combined_view, causal_only);
    bool inputs_finite = true;  // every input element (the model does not track what projections mix)
    for (const Operand<T>* op : {&x, &mem_k, &mem_v})
        for (Index n = 0; n < op->storage.numel(); ++n) inputs_finite = inputs_finite && std::isfinite(op->storage[n]);

    if (!allowed_run.result) {
        const std::string& kind = allowed_run.kind;
        // An overflow inside the SDPA core names "sdpa" and the internal head views (noted for the module's
        // owners); every other error names the module's entry point.
        const bool overflow = kind == "ValueError" && contains(allowed_run.message, "overflowed");
        if (!overflow) require_named(allowed_run.message, "MultiHeadAttention::forward");
        const bool empty_throw = model.any_empty_row() && options.empty_rows == EmptyRowPolicy::Throw;
        ATTN_FUZZ_REQUIRE((kind == "MaskError" && empty_throw) ||
                              (kind == "ValueError" && !empty_throw && options.check_finite &&
                               (!inputs_finite || (overflow && profile.specials))),
                          "unexpected " + kind + ": " + allowed_run.message);
        return;
    }
    ATTN_FUZZ_REQUIRE(!(model.any_empty_row() && options.empty_rows == EmptyRowPolicy::Throw),
                      "an empty row under EmptyRowPolicy::Throw was accepted");
    const MhaResult<T>& r = *allowed_run.result;
    ATTN_FUZZ_REQUIRE(r.output.shape() == (Shape{B, Tq, E}), "output shape " + to_string(r.output.shape()));
    if (inputs_finite && !profile.specials && !model.any_empty_row())
        for (Index n = 0; n < r.output.numel(); ++n)
            ATTN_FUZZ_REQUIRE(std::isfinite(r.output[n]), "non-finite output from finite inputs at flat index " + std::to_string(n));
    if (options.weights == MhaWeights::HeadAverage && !model.any_empty_row() && inputs_finite) {
        MhaOptions per_head = options;
        per_head.weights = MhaWeights::PerHead;
        const MhaResult<T> heads = module->forward(x.view, mem_k.view, mem_v.view, allowed_mask, per_head);
        ATTN_FUZZ_REQUIRE(r.weights && r.weights->shape() == (Shape{B, Tq, Tk}), "head-average weights shape");
        // Mean of H weights in [0, 1], in the compute type C: H - 1 additions and one division, each a relative
        // error <= u_C on a partial sum <= H, then / H: |y - mean| <= 2 (H + 1) u_C (first order (H + 1) u_C; the
        // factor 2 covers the second-order terms). On 16-bit storage y is then rounded once: |fl(y) - y| <= u_S |y|,
        // |y| <= 1 + 2 (H + 1) u_C (0 for float and double, which are their own compute type).
        using C = compute_t<T>;
        const double u_c = std::numeric_limits<C>::epsilon() / 2.0;
        const double u_s = is_half_v<T> ? static_cast<double>(std::numeric_limits<T>::epsilon()) / 2.0 : 0.0;
        const double in_c = 2.0 * static_cast<double>(H + 1) * u_c;
        const double bound = in_c + u_s * (1.0 + in_c);
        for (Index b = 0; b < B; ++b)
            for (Index i = 0; i < Tq; ++i)
                for (Index j = 0; j < Tk; ++j) {
                    long double mean = 0;
                    for (Index h = 0; h < H; ++h) mean += (*heads.weights)({b, h, i, j});
                    mean /= H;
                    const T average = (*r.weights)({b, i, j});
                    // With check_finite off, huge finite inputs may overflow a logit and leave a head's weight NaN
                    // (allowed: the caller turned the checks off); the mean is then NaN too, and nothing else.
                    if (std::isnan(mean)) {
                        ATTN_FUZZ_REQUIRE(std::isnan(average) && !options.check_finite,
                                          "a head weight is NaN; head-average " + std::to_string(average));
                        continue;
                    }
                    const double err = static_cast<double>(std::fabs(mean - static_cast<long double>(average)));
                    ATTN_FUZZ_REQUIRE(err <= bound, "head-average weight off the mean of the heads by " + std::to_string(err));
                }
    }
}

}  // namespace
}  // namespace attn::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    using namespace attn::fuzz;
    FuzzedDataProvider in(data, size);
    // The selector byte: its low two bits choose the case (head path or module, float or double); in a float case
    // its top three bits, which nothing else reads, choose float16 or bfloat16 instead (sixteen_bit_choice), so the
    // rest of the bytes mean the same case whatever the type.
    const auto selector = in.ConsumeIntegral<std::uint8_t>();  // the byte ConsumeIntegralInRange(0, 3) would read
    const int which = selector % 4, half = sixteen_bit_choice(selector >> 5);
    if (which == 0 || which == 1) {
        const HeadPathSizes sizes = HeadPathSizes::decode(in);
        if (which == 1) run_head_path<double>(in, sizes);
        else if (half == 16) run_head_path<attn::float16>(in, sizes);
        else if (half == 8) run_head_path<attn::bfloat16>(in, sizes);
        else run_head_path<float>(in, sizes);
    } else {
        const ModuleSizes sizes = ModuleSizes::decode(in);
        if (which == 3) run_module<double>(in, sizes);
        else if (half == 16) run_module<attn::float16>(in, sizes);
        else if (half == 8) run_module<attn::bfloat16>(in, sizes);
        else run_module<float>(in, sizes);
    }
    return 0;
}
