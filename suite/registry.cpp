// The implementation registry: the library's backends and paths by name, then the mutants.
#include "attn/suite/registry.hpp"

#include <deque>
#include <memory>

#include "attn/plugin/kernel_process.hpp"

#include "attn/detail/mha_sdpa_path.hpp"
#include "attn/error.hpp"
#include "attn/mha.hpp"
#include "attn/tiled.hpp"
#include "mutants/naive.hpp"

namespace attn::suite {

namespace kernels {
Implementation fa2_style();  // kernels/fa2_style.cpp
Implementation fa2_lazy();
Implementation flash_decoding();  // kernels/flash_decoding.cpp
Implementation fa2_bf16_backward();  // kernels/fa2_bf16_backward.cpp
}  // namespace kernels

namespace {

// A library backend selected through SdpaOptions::backend.
// The library's SDPA in T with `adjust` applied to the options (the backend, block sizes).
template <class T, class Adjust>
SdpaFunction<T> library_sdpa(Adjust adjust) {
    return [adjust](TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                    std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        return scaled_dot_product_attention(q, k, v, m, adjust(o));
    };
}

// The library's forward with the lse, then its backward, in T, with `adjust` applied to the options of both.
template <class T, class Adjust>
BackwardFunction<T> library_backward(Adjust adjust) {
    return [adjust](TensorView<const T> q, TensorView<const T> k, TensorView<const T> v, TensorView<const T> dout,
                    std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        SdpaOptions options = adjust(o);
        options.return_lse = true;
        options.return_weights = false;
        const SdpaResult<T> f = scaled_dot_product_attention(q, k, v, m, options);
        return sdpa_backward(q, k, v, f.output.view(), f.lse->view(), dout, m, options);
    };
}

// A library backend selected through SdpaOptions::backend, in every dtype; `adjust` changes the options further.
Implementation library_backend(const std::string& name, const std::string& description, Backend backend,
                               oracle::ErrorModel model,
                               std::function<SdpaOptions(SdpaOptions)> adjust = [](SdpaOptions o) { return o; }) {
    Implementation impl;
    impl.name = name;
    impl.description = description;
    impl.error_model = std::move(model);
    const auto options = [backend, adjust](SdpaOptions o) {
        o.backend = backend;
        return adjust(o);
    };
    impl.run_float = library_sdpa<float>(options);
    impl.run_double = library_sdpa<double>(options);
    impl.run_float16 = library_sdpa<float16>(options);
    impl.run_bfloat16 = library_sdpa<bfloat16>(options);
    impl.backward_float = library_backward<float>(options);
    impl.backward_double = library_backward<double>(options);
    impl.backward_float16 = library_backward<float16>(options);
    impl.backward_bfloat16 = library_backward<bfloat16>(options);
    return impl;
}

// The suite's grouped-query layout (q (B, G, R, Tq, Dk), k and v (B, G, 1, Tk, D), mask up to rank 5) as the 4-D
// layout mha_sdpa_path takes (q (B, H, Tq, Dk), k and v (B, G, Tk, D), mask broadcastable to (B, H, Tq, Tk)), by
// strides only: dims 1 and 2 merge into H = G * R (R's stride times R is G's stride, or one of them is size 1).
template <class T>
TensorView<T> merge_dims_1_2(TensorView<T> x, const std::string& name) {
    if (x.rank() != 5) return x;
    const Index g = x.dim(1), r = x.dim(2);
    Index stride;
    if (g == 1) stride = x.stride(2);
    else if (r == 1) stride = x.stride(1);
    else if (x.stride(1) == r * x.stride(2)) stride = x.stride(2);
    else throw ShapeError("suite mha: " + name + " " + to_string(x.shape()) + " cannot be viewed as 4-D");
    return TensorView<T>(x.data(), {x.dim(0), g * r, x.dim(3), x.dim(4)}, {x.stride(0), stride, x.stride(3), x.stride(4)});
}

// A float option of the grouped layout (the bias up to (B, G, R, Tq, Tk), the slopes up to (B, G, R)) copied as
// (B, G*R, ...): broadcast to the grouped `full` shape first, since G and R may broadcast differently. One that does
// not broadcast is left as it is, for the library to refuse.
template <class T>
std::optional<Tensor<T>> merge_option_1_2(const std::optional<FloatView>& option, Shape full) {
    const TensorView<const T>* view = option ? option->get<T>() : nullptr;
    if (!view || full.size() < 3 || view->rank() > static_cast<Index>(full.size())) return std::nullopt;
    try {
        Tensor<T> copy = Tensor<T>::copy_of(view->broadcast_to(full, "suite mha", "option"));
        full[1] *= full[2];
        full.erase(full.begin() + 2);
        return std::move(copy).reshaped(full);
    } catch (const ShapeError&) {
        return std::nullopt;
    }
}

template <class T>
SdpaResult<T> run_mha_path(TensorView<const T> q, TensorView<const T> k, TensorView<const T> v,
                           std::optional<TensorView<const bool>> m, SdpaOptions o) {
    if (m) m = merge_dims_1_2(*m, "allowed_mask");
    std::optional<Tensor<T>> bias, slopes;  // alive for the call
    if (q.rank() == 5) {
        const Shape batch(q.shape().begin(), q.shape().end() - 2);
        Shape scores = batch;
        scores.push_back(q.dim(3));
        scores.push_back(k.dim(3));
        if ((bias = merge_option_1_2<T>(o.bias, scores))) o.bias = *bias;
        if ((slopes = merge_option_1_2<T>(o.alibi_slopes, batch))) o.alibi_slopes = *slopes;
    }
    return detail::mha_sdpa_path(merge_dims_1_2(q, "q"), merge_dims_1_2(k, "k"), merge_dims_1_2(v, "v"), m, o);
}

std::vector<Implementation> build() {
    std::vector<Implementation> all;
    all.push_back(library_backend("reference", "the library's reference backend (BLIS gemm, softmax, BLIS gemm)",
                                  Backend::Reference, oracle::reference_model()));
    // The oracle's model of the tiled kernel, with the kernel's key block (attn/tiled.hpp).
    all.push_back(library_backend("tiled", "the library's tiled backend (online softmax over key blocks, Highway exp)",
                                  Backend::Tiled, oracle::library_tiled_model()));
    all.back().returns_weights = false;
    // The same kernel with blocks of 3 queries and 5 keys: every step between blocks (rescaling, the blocks' partial
    // sums, a causal row ending inside a block) at the sizes the properties use, with blocks that divide neither
    // Tq nor Tk as a rule.
    all.push_back(library_backend("tiled_small_blocks",
                                  "the library's tiled backend with query blocks of 3 and key blocks of 5",
                                  Backend::Tiled, oracle::library_tiled_model(5), [](SdpaOptions o) {
                                      // unless the call sets its own (a bad one is then refused)
                                      if (o.tiled_query_block == 0) o.tiled_query_block = 3;
                                      if (o.tiled_key_block == 0) o.tiled_key_block = 5;
                                      return o;
                                  }));
    all.back().returns_weights = false;
    Implementation mha;
    mha.name = "mha";
    mha.description = "SDPA inputs through MultiHeadAttention's head split, SDPA core and head merge (mha_sdpa_path)";
    mha.error_model = oracle::reference_model();
    mha.run_float = run_mha_path<float>;
    mha.run_double = run_mha_path<double>;
    mha.run_float16 = run_mha_path<float16>;
    mha.run_bfloat16 = run_mha_path<bfloat16>;
    const auto head_backward = [](auto q, auto k, auto v, auto dout, Index H, Index G,
                                  std::optional<TensorView<const bool>> m, const MhaOptions& o, const MhaDropout& d) {
        return multi_head_sdpa_backward(q, k, v, dout, H, G, m, o, d);
    };
    mha.head_backward_float = head_backward;
    mha.head_backward_double = head_backward;
    mha.head_backward_float16 = head_backward;
    mha.head_backward_bfloat16 = head_backward;
    all.push_back(std::move(mha));
    // Correct kernels in arithmetic the library's backends do not use, each under the error model that claims it.
    for (Implementation k : {kernels::fa2_style(), kernels::fa2_lazy(), kernels::flash_decoding(),
                              kernels::fa2_bf16_backward()}) {
        k.returns_weights = false;
        k.bias_unsupported = k.name + " adds no bias to its logits (SdpaOptions::bias, alibi_slopes)";
        all.push_back(std::move(k));
    }
    for (Implementation& m : mutant::all()) all.push_back(std::move(m));
    for (Implementation& m : mutant::sixteen_bit()) all.push_back(std::move(m));
    // What has no path in a dtype (forward or head-path backward) says so, and runs skip that dtype.
    for (Implementation& i : all)
        for (const Dtype d : all_dtypes()) {
            const bool has = d == Dtype::Float     ? bool(i.run_float) || bool(i.head_backward_float)
                             : d == Dtype::Double  ? bool(i.run_double) || bool(i.head_backward_double)
                             : d == Dtype::Float16 ? bool(i.run_float16) || bool(i.head_backward_float16)
                                                   : bool(i.run_bfloat16) || bool(i.head_backward_bfloat16);
            if (!has && !i.dtype_unsupported.count(d))
                i.dtype_unsupported[d] = std::string(to_string(d)) + " (" + i.name + " has no " + to_string(d) + " path)";
        }
    return all;
}

}  // namespace

const std::vector<Implementation>& implementations() {
    static const std::vector<Implementation> all = build();
    return all;
}

std::vector<const Implementation*> correct_implementations() {
    std::vector<const Implementation*> r;
    for (const Implementation& i : implementations())
        if (!i.is_mutant) r.push_back(&i);
    return r;
}

std::vector<const Implementation*> mutants() {
    std::vector<const Implementation*> r;
    for (const Implementation& i : implementations())
        if (i.is_mutant) r.push_back(&i);
    return r;
}

namespace {
// External kernels loaded so far (a deque: references stay valid as more are loaded).
std::deque<Implementation>& externals() {
    static std::deque<Implementation> loaded;
    return loaded;
}
}  // namespace

Implementation external_implementation(std::shared_ptr<plugin::KernelProcess> kernel, const std::string& path);  // external.cpp

namespace {
const Implementation& register_external(Implementation impl) {
    const std::string& path = impl.kernel_path;
    if (const Implementation* same = find_implementation(impl.name)) {
        if (same->kernel_path == impl.kernel_path) return *same;
        throw ConfigError("suite: kernel " + path + " is named " + impl.name + ", as " +
                          (same->kernel_path.empty() ? "one of the suite's own implementations" : "kernel " + same->kernel_path) +
                          " already is; names must be unique");
    }
    externals().push_back(std::move(impl));
    return externals().back();
}
}  // namespace

const Implementation& load_external(const std::string& path, double timeout_seconds) {
    return register_external(external_implementation(std::make_shared<plugin::KernelProcess>(path, timeout_seconds), path));
}

const Implementation& connect_external(int socket, int memfd, const std::string& origin) {
    Implementation impl = external_implementation(
        std::make_shared<plugin::KernelProcess>(plugin::KernelProcess::Connection{socket, memfd}, 0.0), origin);
    impl.replay_template = "attn.properties(fn, replay='{case}')";
    return register_external(std::move(impl));
}

const Implementation* find_implementation(const std::string& name) {
    for (const Implementation& i : implementations())
        if (i.name == name) return &i;
    for (const Implementation& i : externals())
        if (i.name == name) return &i;
    return nullptr;
}

const Implementation& implementation(const std::string& name) {
    if (const Implementation* i = find_implementation(name)) return *i;
    std::string known;
    for (const Implementation& i : implementations()) known += " " + i.name;
    for (const Implementation& i : externals()) known += " " + i.name;
    throw ConfigError("suite: no implementation named '" + name + "'; known:" + known);
}

}  // namespace attn::suite
