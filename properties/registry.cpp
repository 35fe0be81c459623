// The implementation registry: the library's backends and paths by name, then the mutants.
#include "attn/suite/registry.hpp"

#include "attn/error.hpp"
#include "mutants/naive.hpp"

namespace attn::suite {

namespace {

// A library backend selected through SdpaOptions::backend.
Implementation library_backend(const std::string& name, const std::string& description, Backend backend,
                               oracle::ErrorModel model) {
    Implementation impl;
    impl.name = name;
    impl.description = description;
    impl.error_model = std::move(model);
    impl.run_float = [backend](TensorView<const float> q, TensorView<const float> k, TensorView<const float> v,
                               std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        SdpaOptions options = o;
        options.backend = backend;
        return scaled_dot_product_attention(q, k, v, m, options);
    };
    impl.run_double = [backend](TensorView<const double> q, TensorView<const double> k, TensorView<const double> v,
                                std::optional<TensorView<const bool>> m, const SdpaOptions& o) {
        SdpaOptions options = o;
        options.backend = backend;
        return scaled_dot_product_attention(q, k, v, m, options);
    };
    return impl;
}

std::vector<Implementation> build() {
    std::vector<Implementation> all;
    all.push_back(library_backend("reference", "the library's reference backend (BLIS gemm, softmax, BLIS gemm)",
                                  Backend::Reference, oracle::reference_model()));
    for (Implementation& m : mutants::all()) all.push_back(std::move(m));
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

const Implementation& implementation(const std::string& name) {
    for (const Implementation& i : implementations())
        if (i.name == name) return i;
    std::string known;
    for (const Implementation& i : implementations()) known += " " + i.name;
    throw ConfigError("suite: no implementation named '" + name + "'; known:" + known);
}

}  // namespace attn::suite
