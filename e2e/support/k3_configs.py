"""Small config.json files standing in for the Kimi-K3 checkpoint and its DSpark drafter (no
weights): what the image probe reads, in the vllm tier from a directory and on the real node
from the fake Hub."""

from __future__ import annotations

from typing import Any

TARGET_CONFIG: dict[str, Any] = {
    "model_type": "kimi_k3",
    "architectures": ["KimiLinearForCausalLM"],
    "text_config": {
        "model_type": "kimi_linear",
        "num_attention_heads": 96,
        "num_experts": 896,
        "vocab_size": 163840,
        # The recipe's context length; without it vLLM's kimi_linear config says 4096.
        "max_position_embeddings": 1048576,
    },
}
DRAFTER_CONFIG: dict[str, Any] = {
    "architectures": ["K3DSparkModel"],
    "model_type": "k3_dspark",
    "vocab_size": 163840,
    "draft_vocab_size": 163840,
    "target_layer_ids": [2, 23, 47, 71, 89],
    "num_target_layers": 5,
}
