// The list of properties, in the order the mutant table tries them (cheap and sharp ones first).
#include "attn/suite/property.hpp"

namespace attn::suite {

Property gradients_match_oracle_within_bound();
Property gradient_bits_do_not_depend_on_the_thread_count();
Property keys_no_query_reads_get_zero_gradients();
Property gqa_gradients_are_the_group_sums();
Property dq_ignores_keys_the_query_may_not_read();
Property gradients_are_linear_in_dout();
Property dk_sums_to_zero_over_the_keys();
Property rows_sum_to_one();
Property masked_keys_get_zero_weight();
Property heads_split_equals_separate_attention();
Property scaling_keeps_logit_variance_near_one();
Property matches_oracle_within_bound();
Property future_tokens_do_not_change_past_outputs();
Property padding_values_do_not_matter();
Property a_nan_reaches_only_the_rows_that_read_it();
Property bad_calls_are_refused_with_an_error_naming_them();
Property key_permutation_equivariance();
Property mask_broadcast_equals_expanded_mask();
Property cross_attention_matches_oracle();
Property outputs_are_convex_mixtures_of_readable_values();
Property softmax_shift_invariance();
Property blocked_and_allowed_conventions_agree();
Property empty_rows_follow_the_policy();
Property gqa_equals_mha_with_repeated_kv_heads();
Property thread_count_does_not_change_bits();
Property backends_agree_within_bounds();
Property module_matches_oracle_within_bound();
Property dropout_zeroes_or_rescales_each_weight_exactly();
Property dropout_gradients_match_oracle_within_bound();
Property a_nan_reaches_only_the_gradients_that_read_it();
Property module_bad_calls_are_refused_with_an_error_naming_them();
Property key_padding_mask_allows_exactly_the_tokens_that_are_not_pad();
Property degenerate_sizes_give_their_limits();
Property strided_inputs_give_the_bits_of_contiguous_ones();
Property batch_dims_are_only_a_layout();
Property head_path_gives_the_bits_of_sdpa();
Property output_into_gives_the_bits_of_the_returned_output();
Property a_row_of_minus_infinite_logits_is_nan();
Property window_equals_the_mask_it_describes();
Property causal_window_is_the_window_with_right_zero();
Property softcap_bounds_the_weight_ratios();
Property a_large_softcap_is_plain_attention();
Property a_minus_infinite_bias_is_a_false_in_the_mask();
Property a_row_constant_bias_changes_nothing();
Property alibi_equals_the_explicit_bias_it_describes();
Property an_overflow_is_refused_by_name();
Property the_forced_simd_target_is_the_one_fingerprinted();
Property auto_is_the_backend_its_rule_picks();

const std::vector<Property>& properties() {
    static const std::vector<Property> all = {
        // First: it applies only to implementations with a backward pass, and the mutant table tries properties in
        // this order, so a backward mutant (whose forward is correct) meets it before the forward's.
        gradients_match_oracle_within_bound(),
        dropout_gradients_match_oracle_within_bound(),
        gradient_bits_do_not_depend_on_the_thread_count(),
        keys_no_query_reads_get_zero_gradients(),
        gqa_gradients_are_the_group_sums(),
        dq_ignores_keys_the_query_may_not_read(),
        gradients_are_linear_in_dout(),
        dk_sums_to_zero_over_the_keys(),
        a_nan_reaches_only_the_gradients_that_read_it(),
        rows_sum_to_one(),
        masked_keys_get_zero_weight(),
        heads_split_equals_separate_attention(),
        scaling_keeps_logit_variance_near_one(),
        matches_oracle_within_bound(),
        future_tokens_do_not_change_past_outputs(),
        padding_values_do_not_matter(),
        a_nan_reaches_only_the_rows_that_read_it(),
        bad_calls_are_refused_with_an_error_naming_them(),
        key_permutation_equivariance(),
        mask_broadcast_equals_expanded_mask(),
        cross_attention_matches_oracle(),
        outputs_are_convex_mixtures_of_readable_values(),
        softmax_shift_invariance(),
        blocked_and_allowed_conventions_agree(),
        empty_rows_follow_the_policy(),
        gqa_equals_mha_with_repeated_kv_heads(),
        thread_count_does_not_change_bits(),
        backends_agree_within_bounds(),
        module_matches_oracle_within_bound(),
        dropout_zeroes_or_rescales_each_weight_exactly(),
        module_bad_calls_are_refused_with_an_error_naming_them(),
        key_padding_mask_allows_exactly_the_tokens_that_are_not_pad(),
        degenerate_sizes_give_their_limits(),
        strided_inputs_give_the_bits_of_contiguous_ones(),
        batch_dims_are_only_a_layout(),
        head_path_gives_the_bits_of_sdpa(),
        output_into_gives_the_bits_of_the_returned_output(),
        a_row_of_minus_infinite_logits_is_nan(),
        window_equals_the_mask_it_describes(),
        causal_window_is_the_window_with_right_zero(),
        softcap_bounds_the_weight_ratios(),
        a_large_softcap_is_plain_attention(),
        a_minus_infinite_bias_is_a_false_in_the_mask(),
        a_row_constant_bias_changes_nothing(),
        alibi_equals_the_explicit_bias_it_describes(),
        an_overflow_is_refused_by_name(),
        the_forced_simd_target_is_the_one_fingerprinted(),
        auto_is_the_backend_its_rule_picks(),
    };
    return all;
}

}  // namespace attn::suite
