// An external kernel (attn/kernel_abi.h) as a suite implementation: the call is validated and its contracts checked
// exactly as for the suite's own kernels (make_sdpa_problem, check_contracts: shapes, NaN at readable positions,
// empty rows under Throw), then laid out in the kernel's rank-4 form and run in the kernel's worker process.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <type_traits>
#include <vector>

#include "attn/detail/problem.hpp"
#include "attn/error.hpp"
#include "attn/kernel_abi.h"
#include "attn/plugin/kernel_process.hpp"
#include "attn/suite/registry.hpp"

namespace attn::suite {

namespace {

using plugin::InputTensor;
using plugin::KernelInfo;
using plugin::KernelProcess;

// A rank-4 tensor being laid out for the kernel: its storage and the strides into it.
template <class E>
struct Laid {
    std::vector<E> data;
    std::array<std::int64_t, 4> shape{}, strides{};
    InputTensor input() const {
        return InputTensor{data.data(), data.size() * sizeof(E), shape, strides};
    }
};

// (n0, n1, n2, n3) stored in the memory order `order` (a permutation of the dims, slowest first), each dim of
// extent 1 in `stored` given stride 0 (a broadcast view).
template <class E>
Laid<E> lay_out(const std::array<std::int64_t, 4>& shape, const std::array<std::int64_t, 4>& stored,
                const std::array<int, 4>& order) {
    Laid<E> t;
    t.shape = shape;
    std::int64_t stride = 1;
    for (int k = 3; k >= 0; --k) {
        const int d = order[static_cast<std::size_t>(k)];
        t.strides[static_cast<std::size_t>(d)] = stored[static_cast<std::size_t>(d)] == 1 && shape[static_cast<std::size_t>(d)] != 1 ? 0 : stride;
        stride *= stored[static_cast<std::size_t>(d)];
    }
    t.data.assign(static_cast<std::size_t>(stride), E{});
    return t;
}

template <class E>
E& at(Laid<E>& t, std::int64_t a, std::int64_t b, std::int64_t c, std::int64_t d) {
    return t.data[static_cast<std::size_t>(a * t.strides[0] + b * t.strides[1] + c * t.strides[2] + d * t.strides[3])];
}

template <class T>
std::string unsupported_dtype() {
    return std::is_same_v<T, float> ? "float32 (not among the kernel's dtypes)" : "float64 (not among the kernel's dtypes)";
}

// Why an external kernel takes no bias: the one wording of its skip (Implementation::bias_unsupported).
constexpr const char* no_bias_field = "an additive bias or ALiBi (the kernel ABI has neither field)";

template <class T>
SdpaResult<T> run_external(KernelProcess& kernel, TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                           std::optional<TensorView<const bool>> allowed_mask, const SdpaOptions& options) {
    const KernelInfo& info = kernel.info();
    const SdpaProblem<T> p = make_sdpa_problem<T>(info.name, q, k, v, allowed_mask, options);
    const std::vector<Readability> readable = check_contracts(p, options);

    constexpr bool is_float = std::is_same_v<T, float>;
    if (!(info.dtypes & (is_float ? ATTN_KERNEL_FLOAT32 : ATTN_KERNEL_FLOAT64))) throw Unsupported(unsupported_dtype<T>());
    if (info.max_dk && p.Dk > info.max_dk) throw Unsupported("Dk above the kernel's max_dk");
    if (info.max_dv && p.Dv > info.max_dv) throw Unsupported("Dv above the kernel's max_dv");
    const bool any_empty = std::any_of(readable.begin(), readable.end(), [](const Readability& r) { return r.first_empty_row >= 0; });
    const int empty_flag = options.empty_rows == EmptyRowPolicy::Nan ? ATTN_KERNEL_EMPTY_NAN : ATTN_KERNEL_EMPTY_ZERO;
    if (any_empty && !(info.empty_rows & static_cast<std::uint32_t>(empty_flag)))
        throw Unsupported(std::string("rows with no allowed key under empty_rows=") + to_string(options.empty_rows) +
                          " (not among the kernel's empty-row policies)");
    const bool has_bool = (info.masks & ATTN_KERNEL_MASK_BOOL) != 0;
    if (p.allowed_mask && !has_bool) throw Unsupported("an explicit allowed_mask (the kernel declares no bool masks)");
    int causal = ATTN_KERNEL_NOT_CAUSAL;
    PositionRule folded;  // the positional rules given to the kernel as part of its bool mask
    if (p.positions.is_causal) {
        const bool tl = p.positions.alignment == CausalAlignment::TopLeft;
        if (info.masks & (tl ? ATTN_KERNEL_CAUSAL_TOP_LEFT : ATTN_KERNEL_CAUSAL_BOTTOM_RIGHT))
            causal = tl ? ATTN_KERNEL_CAUSAL_TL : ATTN_KERNEL_CAUSAL_BR;
        else if (has_bool) folded.is_causal = true, folded.alignment = p.positions.alignment;
        else throw Unsupported(tl ? "causal top-left (the kernel declares neither its flag nor bool masks)"
                                  : "causal bottom-right (the kernel declares neither its flag nor bool masks)");
    }
    if (p.softcap != 0) throw Unsupported("a softcap (the kernel ABI has no soft-capping field)");
    if (p.has_bias()) throw Unsupported(no_bias_field);
    if (p.positions.window) {
        if (!has_bool) throw Unsupported("a sliding window (the kernel declares no bool masks)");
        folded.window = p.positions.window;
    }
    const bool fold = folded.restricts();

    // The kernel's (B, H): B the first batch dim, H the product of the others (the grouped-query layout's (G, R)
    // merge into H = G R in this order); rank-0 and rank-1 batches get 1s.
    // No batch element: nothing to compute, nothing to send (found by attn fuzz --kernel: H = 0 divided).
    if (p.batch == 0) {
        SdpaResult<T> empty{Tensor<T>(p.output_shape()), std::nullopt};
        if (options.return_weights && info.weights) empty.weights = Tensor<T>(p.weights_shape());
        return empty;
    }
    const Shape& bs = p.batch_shape;
    const Index B = bs.empty() ? 1 : (bs.size() == 1 ? 1 : bs[0]);
    const Index H = p.batch / std::max<Index>(1, B);
    // K/V heads: the fewest groups G (G divides H) such that query head h reads the K/V of the group's first head.
    const auto groups_share = [&](Index G) {
        const Index R = H / G;
        for (Index b = 0; b < B; ++b)
            for (Index h = 0; h < H; ++h) {
                const Index flat = b * H + h, first = b * H + (h / R) * R;
                if (p.k_offset[flat] != p.k_offset[first] || p.v_offset[flat] != p.v_offset[first]) return false;
            }
        return true;
    };
    Index G = H;
    if (info.gqa)
        for (Index g = 1; g < H; ++g)
            if (H % g == 0 && groups_share(g)) {
                G = g;
                break;
            }
    const Index R = H / G;

    // Inputs: dense (B, H, T, D), or for a kernel that honours strides the (B, T, H, D) memory order attention
    // layers produce, and masks with stride 0 wherever they broadcast.
    const std::array<int, 4> bhtd = {0, 1, 2, 3}, order = info.strided ? std::array<int, 4>{0, 2, 1, 3} : bhtd;
    Laid<T> lq = lay_out<T>({B, H, p.Tq, p.Dk}, {B, H, p.Tq, p.Dk}, order);
    Laid<T> lk = lay_out<T>({B, G, p.Tk, p.Dk}, {B, G, p.Tk, p.Dk}, order);
    Laid<T> lv = lay_out<T>({B, G, p.Tk, p.Dv}, {B, G, p.Tk, p.Dv}, order);
    for (Index b = 0; b < B; ++b) {
        for (Index h = 0; h < H; ++h)
            for (Index i = 0; i < p.Tq; ++i)
                for (Index d = 0; d < p.Dk; ++d) at(lq, b, h, i, d) = p.q_row(b * H + h, i)[d * p.q.stride(-1)];
        for (Index g = 0; g < G; ++g)
            for (Index j = 0; j < p.Tk; ++j) {
                for (Index d = 0; d < p.Dk; ++d) at(lk, b, g, j, d) = p.k_row(b * H + g * R, j)[d * p.k.stride(-1)];
                for (Index d = 0; d < p.Dv; ++d) at(lv, b, g, j, d) = p.v_row(b * H + g * R, j)[d * p.v.stride(-1)];
            }
    }
    plugin::ForwardCall call;
    call.bits = is_float ? 32 : 64;
    call.q = lq.input();
    call.k = lk.input();
    call.v = lv.input();
    Laid<std::uint8_t> lm;
    if (p.allowed_mask || fold) {
        // Stored extents: 1 where the mask does not vary (the positional rules vary over queries and keys).
        std::array<std::int64_t, 4> stored = {B, H, p.Tq, p.Tk};
        if (info.strided) {
            const auto offset = [&](Index b, Index h) { return p.allowed_mask ? p.mask_offset[b * H + h] : 0; };
            bool over_b = false, over_h = false;
            for (Index b = 0; b < B; ++b)
                for (Index h = 0; h < H; ++h) {
                    over_b |= offset(b, h) != offset(0, h);
                    over_h |= offset(b, h) != offset(b, 0);
                }
            const bool rows_equal = !fold && (!p.allowed_mask || p.allowed_mask->stride(-2) == 0);
            const bool cols_equal = !fold && (!p.allowed_mask || p.allowed_mask->stride(-1) == 0);
            stored = {over_b ? B : 1, over_h ? H : 1, rows_equal ? 1 : p.Tq, cols_equal ? 1 : p.Tk};
        }
        lm = lay_out<std::uint8_t>({B, H, p.Tq, p.Tk}, stored, bhtd);
        for (Index b = 0; b < stored[0]; ++b)
            for (Index h = 0; h < stored[1]; ++h)
                for (Index i = 0; i < stored[2]; ++i)
                    for (Index j = 0; j < stored[3]; ++j) {
                        bool a = true;
                        if (p.allowed_mask)
                            a = p.allowed_mask->data()[p.mask_offset[b * H + h] + i * p.allowed_mask->stride(-2) +
                                                       j * p.allowed_mask->stride(-1)];
                        if (fold) a = a && folded.allows(i, j, p.Tq, p.Tk);
                        at(lm, b, h, i, j) = a ? 1 : 0;
                    }
        call.mask = lm.input();
    }
    call.out_shape = {B, H, p.Tq, p.Dv};
    call.want_weights = options.return_weights && info.weights;
    call.scale = p.scale;
    call.causal = causal;
    call.empty_rows = empty_flag;
    call.num_threads = options.num_threads;

    SdpaResult<T> r{Tensor<T>(p.output_shape()), std::nullopt};
    if (call.want_weights) r.weights = Tensor<T>(p.weights_shape());
    try {
        kernel.forward(call, r.output.data(), r.weights ? r.weights->data() : nullptr);
    } catch (const plugin::KernelDeclined& e) {
        throw Unsupported(std::string("declined by the kernel: ") + e.what());
    }
    return r;
}

}  // namespace

Implementation external_implementation(std::shared_ptr<KernelProcess> kernel, const std::string& path) {
    const KernelInfo& info = kernel->info();
    Implementation impl;
    impl.name = info.name;
    impl.description = info.description + " (external kernel " + path + (info.version.empty() ? "" : ", version " + info.version) + ")";
    impl.kernel_path = path;
    impl.capabilities = info.capabilities();
    impl.error_model = oracle::model_by_name(info.error_model, info.key_block > 0 ? info.key_block : 64);
    if (info.exp_ulps > 0) impl.error_model.exp_ulps = info.exp_ulps;
    impl.returns_weights = info.weights;
    impl.bias_unsupported = no_bias_field;
    if (!(info.dtypes & ATTN_KERNEL_FLOAT32)) impl.dtype_unsupported[Dtype::Float] = unsupported_dtype<float>();
    if (!(info.dtypes & ATTN_KERNEL_FLOAT64)) impl.dtype_unsupported[Dtype::Double] = unsupported_dtype<double>();
    // ABI version 1 passes float32 and float64 tensors only; its 16-bit flags are reserved.
    for (const Dtype d : {Dtype::Float16, Dtype::BFloat16})
        impl.dtype_unsupported[d] = std::string(to_string(d)) + " (kernel ABI version 1 has no 16-bit tensors yet)";
    impl.run_float = [kernel](TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                              std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return run_external<float>(*kernel, q, k, v, m, o);
    };
    impl.run_double = [kernel](TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                               std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return run_external<double>(*kernel, q, k, v, m, o);
    };
    return impl;
}

}  // namespace attn::suite
