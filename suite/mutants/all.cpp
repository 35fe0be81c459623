// The list of mutants, in the order `attn mutants` reports them (the course module's mistakes first).
#include "naive.hpp"

namespace attn::suite::mutant {

Implementation softmax_over_queries();
Implementation mask_after_softmax();
Implementation inverted_mask_polarity();
Implementation d_model_duplicated_per_head();
Implementation heads_merged_without_transpose();
Implementation empty_rows_ignored();
Implementation no_scale();
Implementation scale_by_dk();
Implementation causal_mask_transposed();
Implementation padding_on_query_rows();
Implementation finite_mask_sentinel();
Implementation no_max_subtraction();
Implementation bottom_right_off_by_one();
Implementation gqa_head_mapping_wrong();
Implementation dropout_without_rescale();
Implementation masked_nan_poisons_output();
Implementation nan_inputs_zeroed();
Implementation thread_dependent_sum();
Implementation window_left_off_by_one();
Implementation window_right_off_by_one();
Implementation window_right_side_ignored();
Implementation window_always_top_left();
Implementation softcap_after_mask();
Implementation softcap_without_division();
Implementation softcap_before_scale();
Implementation bias_before_scale();
Implementation bias_broadcast_over_queries();
Implementation alibi_wrong_sign();
Implementation alibi_top_left();
std::vector<Implementation> backward_mistakes();

std::vector<Implementation> all() {
    std::vector<Implementation> list = {softmax_over_queries(),  mask_after_softmax(),    inverted_mask_polarity(),
            d_model_duplicated_per_head(), heads_merged_without_transpose(), empty_rows_ignored(),
            no_scale(),              scale_by_dk(),           causal_mask_transposed(),
            padding_on_query_rows(), finite_mask_sentinel(),  no_max_subtraction(),
            bottom_right_off_by_one(), gqa_head_mapping_wrong(), dropout_without_rescale(),
            masked_nan_poisons_output(), nan_inputs_zeroed(), thread_dependent_sum(),
            window_left_off_by_one(), window_right_off_by_one(), window_right_side_ignored(),
            window_always_top_left(), softcap_after_mask(), softcap_without_division(), softcap_before_scale(),
            bias_before_scale(), bias_broadcast_over_queries(), alibi_wrong_sign(), alibi_top_left()};
    for (Implementation& m : backward_mistakes()) list.push_back(std::move(m));
    return list;
}

}  // namespace attn::suite::mutant
