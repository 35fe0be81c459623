// attn/oracle/metrics.hpp: the one place error metrics are defined (ULP distance, relative, normwise, error/bound).
#pragma once

#include <optional>
#include <string>

#include "attn/oracle/backward.hpp"
#include "attn/oracle/oracle.hpp"

namespace attn::oracle {

// ULP distance between a computed T and an exact value, in ulps of T at the exact value (the spacing of T's
// binade containing it; the subnormal spacing below the normal range): +0 == -0; NaN matches only an expected NaN
// (distance 0), otherwise infinite; an Inf mismatch is infinite. Opposite signs are measured like any other
// difference, |computed - exact| / spacing: a sign flip of a normal value is ~2^(digits) ulps, while two
// subnormals of opposite sign one spacing from 0 are 2 ulps apart (an earlier "infinite" made a result that the
// bound accepts look infinitely wrong).
template <class T>
double ulp_distance(T computed, long double exact);

// The outcome of comparing a candidate with the oracle. The maxima and the worst element are always reported,
// pass or fail.
struct Comparison {
    Index elements = 0;
    Index violations = 0;         // elements with error > bound (or a NaN/Inf mismatch)
    Index unbounded = 0;          // elements whose bound is infinite (the model cannot bound them; see BOUNDS.md)
    Index nonfinite_mismatches = 0;  // NaN where none was expected, a missing NaN, or a wrong/missing Inf
    double max_ulp = 0;
    double max_abs = 0;
    double max_rel = 0;           // relative to the condition-aware scale sum_k p_k |V_k|, not |o| (ulp near 0 explodes)
    double normwise_rel = 0;      // ||computed - exact||_F / ||exact||_F
    double max_tightness = 0;     // max error / bound; <= 1 is a pass
    Index worst_flat = -1;        // flat index of the element with the largest error / bound
    Shape worst_index;            // its multi-index
    double worst_computed = 0, worst_exact = 0, worst_bound = 0;
    bool pass() const { return violations == 0; }
    std::string summary() const;  // one line, for messages and logs
};

// The row statistic of the statistical verdict (oracle/BOUNDS.md section 10): Q = sum over the rows that take part
// of (max(0, |error| - det) / sigma)^2 for each row's designated element (Result::row_stat_det, row_stat_sigma).
// Under the model it is dominated by a chi-square with `rows` degrees of freedom, so Q > threshold = rows +
// 2 sqrt(rows t) + 2 t, t = ln(2 / statistical_false_alarm), happens with probability at most half of
// statistical_false_alarm per call. Its power: errors 4x what rounding explains reach Q / rows near 16/9 on long
// sequential sums, which the threshold per row, 1.33 at 1024 rows, lets through only below ~700 rows.
struct RowStatistic {
    Index rows = 0;          // rows that take part
    double sum_squares = 0;  // Q
    double threshold = 0;
    bool suspicious() const { return sum_squares > threshold; }
};

// Compares a candidate output (same shape as the oracle's) against the oracle's exact output and bound.
template <class T>
Comparison compare_output(TensorView<const T> candidate, const Result<T>& oracle);
// Weights: relative error is against |p| itself (a weight is its own scale).
template <class T>
Comparison compare_weights(TensorView<const T> candidate, const Result<T>& oracle);
// The same against the statistical bound (Result::output_stat_bound, weights_stat_bound; oracle/BOUNDS.md section
// 10): an element over it is *suspicious*, not wrong. ConfigError when the oracle ran without it.
template <class T>
Comparison compare_output_statistical(TensorView<const T> candidate, const Result<T>& oracle);
template <class T>
Comparison compare_weights_statistical(TensorView<const T> candidate, const Result<T>& oracle);
template <class T>
RowStatistic row_statistic(TensorView<const T> candidate, const Result<T>& oracle);

// The verdict of `attn check`, for the CLI and for a user's own tests alike: the output's comparison, the weights'
// when they were given. It passes when neither has an element over its bound; an element whose bound is infinite
// (Comparison::unbounded) cannot be over it.
struct CheckVerdict {
    Comparison output;
    std::optional<Comparison> weights;
    bool pass() const { return output.pass() && (!weights || weights->pass()); }
    // The statistical verdict beside it, when the oracle computed its statistical bound: the same comparisons
    // against that bound. Suspicious when an element is over it: a kernel whose rounding errors are mean-independent
    // is called suspicious with probability at most statistical_false_alarm per call. The rigorous verdict is unchanged.
    std::optional<Comparison> statistical_output, statistical_weights;
    std::optional<RowStatistic> statistical_rows;
    bool suspicious() const {
        return (statistical_output && !statistical_output->pass()) ||
               (statistical_weights && !statistical_weights->pass()) ||
               (statistical_rows && statistical_rows->suspicious());
    }
};

// Checks a candidate output (batch..., Tq, Dv) and optionally its weights (batch..., Tq, Tk) against the oracle's
// result for the same inputs, and against its statistical bound when it has one; ShapeError when a shape is not the
// oracle's.
template <class T>
CheckVerdict check_candidate(TensorView<const T> candidate_output, const Result<T>& oracle,
                             std::optional<TensorView<const T>> candidate_weights = std::nullopt);

// The backward pass (oracle::sdpa_backward): one gradient of a candidate against the exact one and its bound
// (relative errors against |exact|), and the verdict on the three (attn check --dout). ShapeError when a shape is
// not the input's.
enum class Gradient { Dq, Dk, Dv };
const char* gradient_name(Gradient which);
template <class T>
Comparison compare_gradient(TensorView<const T> candidate, const Gradients<T>& oracle, Gradient which);
struct GradientVerdict {
    std::optional<Comparison> dq, dk, dv;  // those given
    bool pass() const { return (!dq || dq->pass()) && (!dk || dk->pass()) && (!dv || dv->pass()); }
};

}  // namespace attn::oracle
