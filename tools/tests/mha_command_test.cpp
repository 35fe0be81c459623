// `attn mha` end to end: random modules and inputs written as .npy, the program's output against the long-double
// module within 1e-5 relative (float32) and within the derived per-element bound; errors exit 2 with a message.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>

#include <sys/wait.h>
#include <unistd.h>

#include "attn/attn.hpp"
#include "mha_reference.hpp"
#include "cli_run.hpp"
#include "attn/io/npy.hpp"

using namespace attn;
using attn::testing::LD;

namespace {

namespace fs = std::filesystem;
using test::Run;
using test::run_attn;
using test::slurp;
struct Scratch : test::Scratch {
    Scratch() : test::Scratch("attn_mha_command_test") {}
};

Tensor<float> random_tensor(Shape shape, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    Tensor<float> t(std::move(shape));
    for (Index f = 0; f < t.numel(); ++f) t[f] = dist(rng);
    return t;
}

Tensor<bool> random_mask(Shape shape, std::mt19937_64& rng) {
    std::bernoulli_distribution dist(0.75);
    Tensor<bool> t(std::move(shape));
    for (Index f = 0; f < t.numel(); ++f) t[f] = dist(rng);
    return t;
}

}  // namespace

TEST_CASE("attn mha matches the long-double module within 1e-5 relative on random float32 shapes", "[cli][mha]") {
    const Scratch scratch;
    std::mt19937_64 rng(20261130);
    const auto pick = [&](Index lo, Index hi) { return std::uniform_int_distribution<Index>(lo, hi)(rng); };
    const auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
    LD worst_relative = 0, worst_ratio = 0;
    for (int iter = 0; iter < 8; ++iter) {
        const Index H = pick(1, 4), Dh = pick(1, 8), E = H * Dh, B = pick(1, 3), Tq = pick(1, 8);
        Index G = H;
        if (coin()) G = H % 2 == 0 ? H / 2 : 1;
        const int mode = iter % 3;  // 0: self, 1: --memory, 2: --key-memory/--value-memory
        const Index Tk = mode == 0 ? Tq : pick(1, 8);
        const Index kdim = mode == 0 ? E : pick(1, 9), vdim = mode == 0 ? E : mode == 1 ? kdim : pick(1, 9);
        const bool bias = coin(), packed = mode == 0 && G == H && coin();
        const int masking = iter % 4;  // 0: none, 1: allowed 2-D + causal, 2: blocked 4-D, 3: key padding blocked
        std::string args = "mha --x '" + (scratch / "x.npy") + "' --num-heads " + std::to_string(H) + " --num-kv-heads " +
                           std::to_string(G) + " --out '" + (scratch / "out.npy") + "' --weights '" +
                           (scratch / "w.npy") + "' --empty-rows zero";
        const auto write = [&](const std::string& name, const Tensor<float>& t, const std::string& flag) {
            npy::write_file<float>(scratch / name, t.view());
            args += " --" + flag + " '" + (scratch / name) + "'";
        };
        MhaConfig c;
        c.embed_dim = E, c.num_heads = H, c.num_kv_heads = G, c.kdim = kdim, c.vdim = vdim, c.bias = bias;
        MultiHeadAttention<float> module(c);  // the parameters the reference uses, set from the same arrays
        const Tensor<float> x = random_tensor({B, Tq, E}, rng);
        npy::write_file<float>(scratch / "x.npy", x.view());
        const Tensor<float> keys = mode == 0 ? x : random_tensor({B, Tk, kdim}, rng);
        const Tensor<float> values = mode == 0 ? x : mode == 1 ? keys : random_tensor({B, Tk, vdim}, rng);
        if (mode == 1) write("m.npy", keys, "memory");
        if (mode == 2) write("km.npy", keys, "key-memory"), write("vm.npy", values, "value-memory");
        const Tensor<float> wq = random_tensor({E, E}, rng), wk = random_tensor({G * Dh, kdim}, rng),
                            wv = random_tensor({G * Dh, vdim}, rng), wo = random_tensor({E, E}, rng);
        module.set_q_proj_weight(wq), module.set_k_proj_weight(wk), module.set_v_proj_weight(wv);
        module.set_out_proj_weight(wo);
        if (packed) {
            Tensor<float> in_proj({3 * E, E});
            std::copy_n(wq.data(), E * E, in_proj.data());
            std::copy_n(wk.data(), E * E, in_proj.data() + E * E);
            std::copy_n(wv.data(), E * E, in_proj.data() + 2 * E * E);
            write("in_proj.npy", in_proj, "in-proj-weight");
        } else {
            write("wq.npy", wq, "q-proj-weight"), write("wk.npy", wk, "k-proj-weight"), write("wv.npy", wv, "v-proj-weight");
        }
        write("wo.npy", wo, "out-proj-weight");
        if (bias) {
            const Tensor<float> bq = random_tensor({E}, rng), bk = random_tensor({G * Dh}, rng),
                                bv = random_tensor({G * Dh}, rng), bo = random_tensor({E}, rng);
            module.set_q_proj_bias(bq), module.set_k_proj_bias(bk), module.set_v_proj_bias(bv), module.set_out_proj_bias(bo);
            write("bq.npy", bq, "q-proj-bias"), write("bk.npy", bk, "k-proj-bias"), write("bv.npy", bv, "v-proj-bias");
            write("bo.npy", bo, "out-proj-bias");
        }
        std::vector<char> allowed = testing::expand_allowed(std::nullopt, B, H, Tq, Tk, false, {});
        if (masking == 1) {
            const Tensor<bool> m = random_mask({Tq, Tk}, rng);
            npy::write_file<bool>(scratch / "a.npy", m.view());
            args += " --allowed-mask '" + (scratch / "a.npy") + "' --causal bottom-right";
            allowed = testing::expand_allowed(m.view(), B, H, Tq, Tk, true, CausalAlignment::BottomRight);
        } else if (masking == 2) {
            const Tensor<bool> m = random_mask({B, H, Tq, Tk}, rng);
            npy::write_file<bool>(scratch / "b.npy", allowed_to_blocked(m.view()).view());
            args += " --blocked-mask '" + (scratch / "b.npy") + "'";
            allowed = testing::expand_allowed(m.view(), B, H, Tq, Tk, false, {});
        } else if (masking == 3) {
            const Tensor<bool> padding = random_mask({B, Tk}, rng);
            npy::write_file<bool>(scratch / "p.npy", allowed_to_blocked(padding.view()).view());
            args += " --key-padding-blocked '" + (scratch / "p.npy") + "' --causal top-left";
            allowed = testing::expand_allowed(padding.view().unsqueeze(1).unsqueeze(1), B, H, Tq, Tk, true,
                                              CausalAlignment::TopLeft);
        }
        CAPTURE(iter, B, H, G, Dh, Tq, Tk, kdim, vdim, bias, packed, mode, masking, args);
        const Run run = run_attn(scratch, args);
        INFO(run.stderr_text);
        REQUIRE(run.exit_code == 0);
        const auto out = npy::to_tensor<float>(npy::read_file(scratch / "out.npy"), "out.npy");
        const auto weights = npy::to_tensor<float>(npy::read_file(scratch / "w.npy"), "w.npy");
        REQUIRE(out.shape() == Shape{B, Tq, E});
        REQUIRE(weights.shape() == Shape{B, H, Tq, Tk});

        testing::RefInputs in;
        in.B = B, in.Tq = Tq, in.Tk = Tk, in.allowed = allowed;
        in.xq = testing::to_ld<float>(x.view()), in.xk = testing::to_ld<float>(keys.view());
        in.xv = testing::to_ld<float>(values.view());
        const auto ref = testing::ref_mha(testing::ref_module(module), in, testing::comparison_unit_roundoff<float>());
        // The acceptance criterion: max |out - ref| / max |ref| <= 1e-5 (normwise, infinity norm).
        LD max_diff = 0, max_ref = 0;
        for (Index f = 0; f < out.numel(); ++f) {
            max_diff = std::max(max_diff, std::fabs(static_cast<LD>(out[f]) - ref.output[f]));
            max_ref = std::max(max_ref, std::fabs(ref.output[f]));
        }
        const LD relative = max_ref > 0 ? max_diff / max_ref : max_diff;
        const LD ratio = testing::max_error_ratio(out.data(), ref.output, ref.output_bound);
        CHECK(relative <= 1e-5L);
        CHECK(ratio <= 1);
        CHECK(testing::max_error_ratio(weights.data(), ref.weights, ref.weights_bound) <= 1);
        worst_relative = std::max(worst_relative, relative), worst_ratio = std::max(worst_ratio, ratio);
    }
    std::printf("attn mha vs long double (float32): max normwise relative error %.3Lg, max error/bound %.3Lg\n",
                worst_relative, worst_ratio);
}

TEST_CASE("attn mha writes the head average with --average-weights", "[cli][mha]") {
    const Scratch scratch;
    std::mt19937_64 rng(3);
    npy::write_file<double>(scratch / "x.npy", Tensor<double>({1, 3, 4}, 0.5).view());
    Tensor<double> eye({4, 4}, 0.0);
    for (Index i = 0; i < 4; ++i) eye({i, i}) = 1.0;
    npy::write_file<double>(scratch / "w.npy", eye.view());
    const Run run = run_attn(scratch, "mha --x '" + (scratch / "x.npy") + "' --num-heads 2 --q-proj-weight '" +
                                          (scratch / "w.npy") + "' --k-proj-weight '" + (scratch / "w.npy") +
                                          "' --v-proj-weight '" + (scratch / "w.npy") + "' --out-proj-weight '" +
                                          (scratch / "w.npy") + "' --causal top-left --out '" + (scratch / "o.npy") +
                                          "' --weights '" + (scratch / "a.npy") + "' --average-weights");
    INFO(run.stderr_text);
    REQUIRE(run.exit_code == 0);
    const auto average = npy::to_tensor<double>(npy::read_file(scratch / "a.npy"), "a.npy");  // float64 in, float64 out
    REQUIRE(average.shape() == Shape{1, 3, 3});
    // Equal keys: causal row i spreads 1/(i+1) over keys 0..i in every head.
    for (Index i = 0; i < 3; ++i)
        for (Index j = 0; j < 3; ++j) CHECK(average({0, i, j}) == Approx(j <= i ? 1.0 / static_cast<double>(i + 1) : 0.0).margin(1e-15));
}

TEST_CASE("attn mha --softcap caps every head's logits: a tiny cap levels the weights", "[cli][mha]") {
    const Scratch scratch;
    std::mt19937_64 rng(4);
    std::normal_distribution<double> normal(0.0, 3.0);  // logits of several units before the cap
    Tensor<double> x({1, 3, 4}), w4({4, 4});
    for (Index f = 0; f < x.numel(); ++f) x[f] = normal(rng);
    for (Index f = 0; f < w4.numel(); ++f) w4[f] = normal(rng);
    npy::write_file<double>(scratch / "x.npy", x.view());
    npy::write_file<double>(scratch / "w.npy", w4.view());
    const std::string w = "'" + (scratch / "w.npy") + "'";
    const std::string call = "mha --x '" + (scratch / "x.npy") + "' --num-heads 2 --q-proj-weight " + w +
                             " --k-proj-weight " + w + " --v-proj-weight " + w + " --out-proj-weight " + w +
                             " --causal top-left --out '" + (scratch / "o.npy") + "' --weights '" + (scratch / "a.npy") +
                             "' --average-weights";
    const Run run = run_attn(scratch, call + " --softcap 0.001");
    INFO(run.stderr_text);
    REQUIRE(run.exit_code == 0);
    const auto average = npy::to_tensor<double>(npy::read_file(scratch / "a.npy"), "a.npy");
    // Every capped logit lies in (-0.001, 0.001), so the weights of row i are within a factor e^0.002 of each other,
    // each within (e^0.002 - 1) / (i + 1) of 1 / (i + 1), and so is their mean over the heads.
    for (Index i = 0; i < 3; ++i)
        for (Index j = 0; j <= i; ++j)
            CHECK(std::fabs(average({0, i, j}) - 1.0 / double(i + 1)) <= std::expm1(0.002) / double(i + 1) + 1e-15);
    const Run refused = run_attn(scratch, call + " --softcap -1");
    CHECK(refused.exit_code == 2);
    CHECK(refused.stderr_text.find("softcap must be 0 (off) or a positive number") != std::string::npos);
}

TEST_CASE("attn mha takes float masks, key padding bias, ALiBi slopes and a window bitwise as the library does",
          "[cli][mha][bias]") {
    const Scratch scratch;
    std::mt19937_64 rng(6);
    std::uniform_real_distribution<double> dist(-2.0, 2.0);
    const auto random_double = [&](Shape shape) {
        Tensor<double> t(std::move(shape));
        for (Index f = 0; f < t.numel(); ++f) t[f] = dist(rng);
        return t;
    };
    const Index B = 2, H = 2, Tq = 4, Tk = 5, E = 4;
    const double inf = std::numeric_limits<double>::infinity();
    const Tensor<double> x = random_double({B, Tq, E}), memory = random_double({B, Tk, E}), w = random_double({E, E});
    Tensor<double> bias = random_double({B, Tq, Tk}), padding = random_double({B, Tk}), slopes({H});
    bias({1, 2, 0}) = -inf;
    padding({0, 4}) = -inf;
    slopes[0] = 0.25, slopes[1] = 0.5;
    npy::write_file<double>(scratch / "x.npy", x.view());
    npy::write_file<double>(scratch / "m.npy", memory.view());
    npy::write_file<double>(scratch / "w.npy", w.view());
    npy::write_file<double>(scratch / "bias.npy", bias.view());
    npy::write_file<double>(scratch / "pad.npy", padding.view());
    npy::write_file<double>(scratch / "slopes.npy", slopes.view());
    const std::string wq = "'" + (scratch / "w.npy") + "'";
    const std::string call = "mha --x '" + (scratch / "x.npy") + "' --memory '" + (scratch / "m.npy") +
                             "' --num-heads 2 --q-proj-weight " + wq + " --k-proj-weight " + wq + " --v-proj-weight " +
                             wq + " --out-proj-weight " + wq + " --out '" + (scratch / "o.npy") + "' --bias '" +
                             (scratch / "bias.npy") + "' --key-padding-bias '" + (scratch / "pad.npy") +
                             "' --alibi-slopes '" + (scratch / "slopes.npy") + "' --window 2,1 --empty-rows zero";
    const Run run = run_attn(scratch, call);
    INFO(run.stderr_text);
    REQUIRE(run.exit_code == 0);
    const Tensor<double> got = npy::to_tensor<double>(npy::read_file(scratch / "o.npy"), "o.npy");
    MhaConfig c;
    c.embed_dim = E, c.num_heads = H, c.bias = false;
    MultiHeadAttention<double> module(c);
    module.set_q_proj_weight(w.view()), module.set_k_proj_weight(w.view()), module.set_v_proj_weight(w.view());
    module.set_out_proj_weight(w.view());
    MhaOptions o;
    o.bias = bias, o.key_padding_bias = padding, o.alibi_slopes = slopes;
    o.window = SlidingWindow{2, 1, CausalAlignment::BottomRight};
    o.empty_rows = EmptyRowPolicy::Zero;
    const Tensor<double> want = module.forward_cross(x.view(), memory.view(), std::nullopt, o).output;
    REQUIRE(got.shape() == want.shape());
    for (Index f = 0; f < want.numel(); ++f) CHECK(got[f] == want[f]);
    // Without the float masks the output differs: they were read.
    MhaOptions plain;
    plain.window = o.window, plain.empty_rows = o.empty_rows;
    const Tensor<double> unbiased = module.forward_cross(x.view(), memory.view(), std::nullopt, plain).output;
    bool differs = false;
    for (Index f = 0; f < want.numel(); ++f) differs = differs || got[f] != unbiased[f];
    CHECK(differs);
    // A NaN a query reads is refused with exit code 2, naming the float mask and where it is.
    bias({0, 1, 3}) = std::numeric_limits<double>::quiet_NaN();
    npy::write_file<double>(scratch / "bias.npy", bias.view());
    const Run refused = run_attn(scratch, call);
    CHECK(refused.exit_code == 2);
    CHECK(refused.stderr_text.find("bias + key_padding_bias [2,1,4,5] holds nan at batch index [0,0], row 1, column 3") !=
          std::string::npos);
}

TEST_CASE("attn mha reports impossible configurations and wrong shapes with exit code 2", "[cli][mha][errors]") {
    const Scratch scratch;
    std::mt19937_64 rng(5);
    npy::write_file<float>(scratch / "x.npy", random_tensor({1, 2, 6}, rng).view());
    npy::write_file<float>(scratch / "w66.npy", random_tensor({6, 6}, rng).view());
    npy::write_file<float>(scratch / "w65.npy", random_tensor({6, 5}, rng).view());
    const std::string base = "mha --x '" + (scratch / "x.npy") + "' --out '" + (scratch / "o.npy") + "' --out-proj-weight '" +
                             (scratch / "w66.npy") + "'";
    const std::string qkv = " --q-proj-weight '" + (scratch / "w66.npy") + "' --k-proj-weight '" + (scratch / "w66.npy") +
                            "' --v-proj-weight '" + (scratch / "w66.npy") + "'";
    Run run = run_attn(scratch, base + qkv + " --num-heads 4");
    CHECK(run.exit_code == 2);
    CHECK(run.stderr_text.find("embed_dim=6 is not divisible by num_heads=4") != std::string::npos);
    run = run_attn(scratch, base + qkv + " --num-heads 2 --num-kv-heads 4");
    CHECK(run.exit_code == 2);
    CHECK(run.stderr_text.find("num_heads=2 is not a multiple of num_kv_heads=4") != std::string::npos);
    run = run_attn(scratch, base + " --num-heads 2 --q-proj-weight '" + (scratch / "w66.npy") + "' --k-proj-weight '" +
                                (scratch / "w65.npy") + "' --v-proj-weight '" + (scratch / "w66.npy") + "'");
    CHECK(run.exit_code == 2);
    CHECK(run.stderr_text.find("k_proj_weight must be [6,6], got [6,5]") != std::string::npos);
    run = run_attn(scratch, base + " --num-heads 2");
    CHECK(run.exit_code == 2);
    CHECK(run.stderr_text.find("--in-proj-weight") != std::string::npos);
    run = run_attn(scratch, base + qkv + " --num-heads 2 --memory '" + (scratch / "x.npy") + "' --key-memory '" +
                                (scratch / "x.npy") + "'");
    CHECK(run.exit_code == 2);  // CLI11: --memory excludes --key-memory
}

TEMPLATE_TEST_CASE("attn mha runs 16-bit modules bitwise as the library does", "[cli][mha][half]", float16, bfloat16) {
    using S = TestType;
    const Scratch scratch;
    std::mt19937_64 rng(7);
    const auto rounded = [](const Tensor<float>& f) {
        Tensor<S> t(f.shape());
        for (Index i = 0; i < f.numel(); ++i) t[i] = S(f[i]);
        return t;
    };
    const Tensor<S> x = rounded(random_tensor({2, 3, 8}, rng)), mem = rounded(random_tensor({2, 5, 8}, rng));
    const Tensor<S> wq = rounded(random_tensor({8, 8}, rng)), wk = rounded(random_tensor({8, 8}, rng));
    const Tensor<S> wv = rounded(random_tensor({8, 8}, rng)), wo = rounded(random_tensor({8, 8}, rng));
    const Tensor<S> bo = rounded(random_tensor({8}, rng));
    // bfloat16 files are its int16 bits (npy::write_file writes them so), read with --dtype bfloat16.
    for (const auto& [name, t] : {std::pair<const char*, const Tensor<S>*>{"x", &x}, {"mem", &mem}, {"wq", &wq},
                                  {"wk", &wk}, {"wv", &wv}, {"wo", &wo}, {"bo", &bo}})
        npy::write_file<S>(scratch / (std::string(name) + ".npy"), t->view());
    const std::string dtype = std::is_same_v<S, bfloat16> ? " --dtype bfloat16" : "";
    const std::string command = "mha --x '" + (scratch / "x.npy") + "' --memory '" + (scratch / "mem.npy") +
                                "' --num-heads 2 --q-proj-weight '" + (scratch / "wq.npy") + "' --k-proj-weight '" +
                                (scratch / "wk.npy") + "' --v-proj-weight '" + (scratch / "wv.npy") +
                                "' --out-proj-weight '" + (scratch / "wo.npy") + "' --out-proj-bias '" +
                                (scratch / "bo.npy") + "' --out '" + (scratch / "o.npy") + "'" + dtype;
    const Run run = run_attn(scratch, command);
    INFO(run.stderr_text);
    REQUIRE(run.exit_code == 0);

    MhaConfig config;
    config.embed_dim = 8;
    config.num_heads = 2;
    MultiHeadAttention<S> mha(config);
    mha.set_q_proj_weight(wq.view()), mha.set_k_proj_weight(wk.view()), mha.set_v_proj_weight(wv.view());
    mha.set_out_proj_weight(wo.view());
    mha.set_out_proj_bias(bo.view());  // the other biases stay the module's zeros, as the command's missing ones
    const MhaResult<S> expected = mha.forward_cross(x.view(), mem.view());
    npy::Array out = npy::read_file(scratch / "o.npy");
    if constexpr (std::is_same_v<S, bfloat16>) out = npy::as_dtype(std::move(out), npy::DType::BFloat16, "o.npy");
    const Tensor<S> got = npy::to_tensor<S>(out, "o.npy");
    REQUIRE(got.shape() == expected.output.shape());
    CHECK(std::memcmp(got.data(), expected.output.data(), sizeof(S) * static_cast<std::size_t>(got.numel())) == 0);

    // A parameter in another dtype is named, with its dtype and shape.
    npy::write_file<float>(scratch / "wo32.npy", random_tensor({8, 8}, rng).view());
    std::string mixed = command;
    mixed.replace(mixed.find(scratch / "wo.npy"), (scratch / "wo.npy").size(), scratch / "wo32.npy");
    const Run bad = run_attn(scratch, mixed);
    CHECK(bad.exit_code == 2);
    CHECK(bad.stderr_text.find("wo32.npy") != std::string::npos);
    CHECK(bad.stderr_text.find("float32 [8,8]") != std::string::npos);
}
