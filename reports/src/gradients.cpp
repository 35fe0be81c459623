// The report's gradient rows: the backward pass of every implementation that has one, on the smoke grid's
// cross-product cases, against the oracle's exact gradients and their bound (oracle/BOUNDS.md sections 12, 12b).
#include "gradients.hpp"

#include <algorithm>

#include "attn/oracle/backward.hpp"
#include "attn/oracle/metrics.hpp"
#include "attn/suite/case.hpp"
#include "attn/suite/recipe.hpp"
#include "attn/suite/rng.hpp"

namespace attn::report {

namespace {

template <class T>
void measure(const suite::Implementation& impl, const Case& c, Dtype dtype, GradientRow& row) {
    const suite::SdpaCase sdpa_case = suite::make_case(row_config(c, "*", dtype));
    const suite::CaseInputs<T> in = suite::make_inputs<T>(sdpa_case);
    const SdpaOptions options = in.with_bias(sdpa_case.options);
    Shape out_shape = in.q_view.shape();
    out_shape.back() = sdpa_case.Dv;
    Tensor<T> dout(out_shape);
    // dout: normal values from the case's seed (row_config's, the same for every implementation), on a stream of
    // its own (the values' stream starts at the seed itself).
    suite::Rng rng(*sdpa_case.seed ^ 0x9e3779b97f4a7c15ull);
    for (Index x = 0; x < dout.numel(); ++x) dout[x] = static_cast<T>(rng.normal());
    const SdpaGradients<T> g = impl.backward<T>(in.q_view, in.k_view, in.v_view, dout.view(), in.allowed_view, options);
    oracle::OracleOptions oo;
    oo.model = impl.error_model;
    const oracle::Gradients<T> exact =
        oracle::sdpa_backward<T>(in.q_view, in.k_view, in.v_view, dout.view(), in.allowed_view, options, oo);
    const Tensor<T>* got[3] = {&g.dq, &g.dk, &g.dv};
    const oracle::Gradient which[3] = {oracle::Gradient::Dq, oracle::Gradient::Dk, oracle::Gradient::Dv};
    ++row.cases;
    for (int n = 0; n < 3; ++n) {
        const oracle::Comparison cmp = oracle::compare_gradient<T>(got[n]->view(), exact, which[n]);
        row.violations += cmp.violations;
        row.unbounded += cmp.unbounded;
        row.max_ulp[n] = std::max(row.max_ulp[n], cmp.max_ulp);
        if (cmp.max_tightness > row.max_tightness[n]) row.max_tightness[n] = cmp.max_tightness;
        row.tightness.push_back(cmp.max_tightness);
        if (cmp.max_tightness >= row.worst_tightness) {
            row.worst_tightness = cmp.max_tightness;
            row.worst_config = config_string(c, impl.name, dtype);
        }
        Row r;
        r.config = gradient_row_config(oracle::gradient_name(which[n]), config_string(c, impl.name, dtype));
        r.impl = impl.name;
        r.dtype = dtype;
        r.grid_case = c;
        fill_comparison(r, cmp, dtype);
        row.rows.push_back(std::move(r));
    }
}

}  // namespace

std::vector<GradientRow> gradient_rows(const std::vector<Case>& cases,
                                       const std::vector<const suite::Implementation*>& impls) {
    std::vector<GradientRow> rows;
    for (const suite::Implementation* impl : impls) {
        if (!impl->has_backward()) continue;
        for (const Dtype dtype : {Dtype::Float, Dtype::Double}) {
            if (impl->dtype_unsupported.count(dtype)) continue;  // no path in this dtype (a 16-bit test kernel)
            GradientRow row;
            row.impl = impl->name;
            row.dtype = dtype;
            for (const Case& c : cases) {
                try {
                    if (dtype == Dtype::Float) measure<float>(*impl, c, dtype, row);
                    else measure<double>(*impl, c, dtype, row);
                } catch (const suite::Unsupported&) {
                    ++row.skipped;
                } catch (const std::exception& e) {
                    ++row.errors;
                    row.first_error = config_string(c, impl->name, dtype) + ": " + e.what();
                    for (const char* g : {"dq", "dk", "dv"}) {  // a failed case is a row that now fails, for drift
                        Row r;
                        r.config = gradient_row_config(g, config_string(c, impl->name, dtype));
                        r.impl = impl->name;
                        r.dtype = dtype;
                        r.grid_case = c;
                        r.error = e.what();
                        row.rows.push_back(std::move(r));
                    }
                }
            }
            std::sort(row.tightness.begin(), row.tightness.end());
            rows.push_back(std::move(row));
        }
    }
    return rows;
}

}  // namespace attn::report
