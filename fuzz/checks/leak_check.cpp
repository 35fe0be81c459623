// fuzz/checks/leak_check.cpp: built with the fuzz preset (clang, libomp, ASan), run by `attn fuzz --smoke`.
// Repeats small SDPA calls on every path (reference, tiled, the module's head path; 1 and 2 threads) and checks
// that the heap does not grow from call to call. Why: built with clang's libomp next to Debian's OpenMP BLIS,
// every BLIS call inside a serialized OpenMP region leaked ~200 bytes; no single input shows it, so the fuzzers
// only met it as an out-of-memory stop after 800k executions.
#include <sanitizer/allocator_interface.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <random>

#include "attn/attn.hpp"
#include "attn/detail/mha_sdpa_path.hpp"

using namespace attn;

namespace {

// The smallest heap growth over `calls` calls in up to three rounds. A leak of even one byte per call shows in
// every round. BLIS's packing-block pool does not: on a loaded machine (2 threads on 2 busy cores) it sometimes
// grows by whole ~1 MB blocks in one round (seen as 17 MB in 3000 calls, every byte in libblis's pool allocation,
// __sanitizer_print_memory_profile) and then stops; that is the pool sizing itself, not a per-call leak.
template <class F>
std::size_t growth(int calls, const F& call) {
    for (int i = 0; i < calls / 10; ++i) call();  // warm-up: BLIS's block pool, OpenMP's thread pool, first touches
    std::size_t least = SIZE_MAX;
    for (int round = 0; round < 3 && least >= static_cast<std::size_t>(calls); ++round) {
        const std::size_t before = __sanitizer_get_current_allocated_bytes();
        for (int i = 0; i < calls; ++i) call();
        const std::size_t after = __sanitizer_get_current_allocated_bytes();
        least = std::min(least, after > before ? after - before : 0);
    }
    return least;
}

}  // namespace

int main() {
    std::mt19937 gen(7);
    std::normal_distribution<float> normal;
    Tensor<float> q({2, 3, 5, 8}), k({2, 3, 7, 8}), v({2, 3, 7, 4});
    for (Tensor<float>* t : {&q, &k, &v})
        for (Index i = 0; i < t->numel(); ++i) (*t)[i] = normal(gen);
    constexpr int calls = 3000;
    int failures = 0;
    for (const Backend backend : {Backend::Reference, Backend::Tiled})
        for (const int threads : {1, 2})
            for (const bool module_path : {false, true}) {
                SdpaOptions options;
                options.backend = backend;
                options.num_threads = threads;
                options.is_causal = true;
                const std::size_t bytes = growth(calls, [&] {
                    const SdpaResult<float> r = module_path ? detail::mha_sdpa_path(q.view(), k.view(), v.view(), std::nullopt, options)
                                                            : scaled_dot_product_attention(q.view(), k.view(), v.view(),
                                                                                           std::nullopt, options);
                    if (r.output.numel() != 2 * 3 * 5 * 4) std::abort();
                });
                // Every block a call allocates is freed by its end; a leak of even one byte per call adds `calls`.
                const bool ok = bytes < calls;
                failures += !ok;
                std::printf("  leak check %-9s %d thread(s) %-10s heap growth over %d calls: %zu bytes %s\n",
                            backend == Backend::Tiled ? "tiled" : "reference", threads,
                            module_path ? "mha path" : "sdpa", calls, bytes, ok ? "ok" : "LEAK");
            }
    return failures == 0 ? 0 : 1;
}
