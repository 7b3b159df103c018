"""The scenarios of ``coverage_world.py`` by name, importable without SGLang (the test process never
imports it): isolation worlds (one per pool class or variant), planted twins, start-up checks."""

ISOLATION = ("mha", "mha_token_allocator", "mha_hnd", "mha_nvfp4_scales_and_workspace", "mha_fp4_mx_block16_scales",
             "mha_fp4", "mha_mxfp8", "mha_mxfp8_interleaved_scales", "mha_page_major", "k_only", "mla", "mla_fp4_scales",
             "dsa_indexer", "minimax_sparse_composite", "draft_of_another_shape")

# twin -> (isolation world, adapter planted, label part of the tensor left out, what the oracle must name)
TWINS = {
    "nvfp4_scale": ("mha_nvfp4_scales_and_workspace", "MHATokenToKVPool", "v_scale_buffer[1]", "v_scale_buffer[1]"),
    "nvfp4_workspace": ("mha_nvfp4_scales_and_workspace", "MHATokenToKVPool", "dq_k_buffer", "dq_k_buffer"),
    "mxfp8_scale": ("mha_mxfp8", "MHATokenToKVPoolMXFP8", "k_scale_buffer[0]", "k_scale_buffer[0]"),
    "dsa_index": ("dsa_indexer", "DSATokenToKVPool", "index_key_cache.buffer[0]", "index_key_cache.buffer[0]"),
    "mla_fp4_scale": ("mla_fp4_scales", "MLATokenToKVPoolFP4", "kv_scale_buffer[1]", "kv_scale_buffer[1]"),
    "minimax_index_k": ("minimax_sparse_composite", "MHATokenToKOnlyPool", "index_k_pool.k_buffer[0]",
                        "index_k_pool.k_buffer[0]"),
    "draft_buffer": ("draft_of_another_shape", "MHATokenToKVPool", "draft1:MHATokenToKVPool.v_buffer[0]",
                     "pool1.v_buffer[0]"),
}


REFUSALS = ("configured_target_and_draft", "configured_mxfp8_and_mla", "swa_refused_through_sglangs_swa_allocator",
            "swa_accepted_covers_both_sub_pools", "unknown_pool_class_refused", "adapter_missing_a_tensor_refused_at_start",
            "unknown_tensor_refused",
            "hybrid_linear_refuses_mamba_state", "unconstructible_classes_refused_by_class", "post_capture_pool_refused",
            "server_features_refused_unless_accepted", "memory_saver_refused_unless_accepted",
            "decode_retraction_host_pool_refused",
            "draft_after_first_use_refused", "init_pools_refuses_an_allocator_kvshield_does_not_manage",
            "overlapping_buffers_refused",
            "signature_mismatch_stops_the_rank")
