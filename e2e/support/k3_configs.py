"""Small config.json files standing in for the Kimi-K3 checkpoint and its DSpark drafter (no
weights): what the image probe reads, in the vllm tier from a directory and on the real node
from the fake Hub. They carry every field the Kimi-K3 and DSpark classes read when the probe
constructs them (on the meta device): the heads, experts, vocabulary and context the
reference gives, and MLA, MoE and KDA sizes of the same family where it gives none."""

from __future__ import annotations

from typing import Any

# MLA sizes of the family's published checkpoints (DeepSeek-V3 and Kimi-K2 share them).
MLA: dict[str, Any] = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
LAYERS = 93
TARGET_CONFIG: dict[str, Any] = {
    "model_type": "kimi_k3",
    "architectures": ["KimiLinearForCausalLM"],
    "text_config": {
        "model_type": "kimi_linear",
        "num_attention_heads": 96,
        "num_key_value_heads": 96,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "num_hidden_layers": LAYERS,
        "num_experts": 896,
        "num_experts_per_token": 16,
        "num_shared_experts": 1,
        "moe_intermediate_size": 2048,
        "first_k_dense_replace": 1,
        "vocab_size": 163840,
        # The recipe's context length; without it vLLM's kimi_linear config says 4096.
        "max_position_embeddings": 1048576,
        "mla_use_nope": True,
        **MLA,
        # Three KDA (linear attention) layers to each full-attention one.
        "linear_attn_config": {
            "kda_layers": [i for i in range(1, LAYERS + 1) if i % 4],
            "full_attn_layers": [i for i in range(1, LAYERS + 1) if i % 4 == 0],
            "head_dim": 128,
            "num_heads": 96,
            "short_conv_kernel_size": 4,
            "use_full_rank_gate": True,
        },
        "torch_dtype": "bfloat16",
    },
}
DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "vocab_size": 163840,
    "draft_vocab_size": 163840,
    "target_layer_ids": [2, 23, 47, 71, 89],
    "num_target_layers": 5,
    "num_hidden_layers": 5,
    "hidden_size": 7168,
    "target_hidden_size": 7168,
    "intermediate_size": 18432,
    "num_attention_heads": 96,
    "num_key_value_heads": 96,
    "markov_rank": 1,
    # The token the drafter fills its parallel drafting slots with.
    "dspark_noise_token_id": 163838,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "max_position_embeddings": 1048576,
    "torch_dtype": "bfloat16",
    **MLA,
}
