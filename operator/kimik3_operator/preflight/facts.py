"""What the preflight knows about the target and drafter checkpoints (their config.json)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

# Kimi-K3's published shape, used when no config.json is at hand.
KIMI_K3_HEADS = 96
KIMI_K3_EXPERTS = 896
KIMI_K3_VOCAB = 163840
KIMI_K3_CONTEXT = 1_048_576  # the recipe's context length: max_position_embeddings


@dataclass(frozen=True)
class TargetFacts:
    attention_heads: int = KIMI_K3_HEADS
    experts: int = KIMI_K3_EXPERTS
    vocab_size: int = KIMI_K3_VOCAB
    hidden_layers: int | None = None
    source: str = "Kimi-K3 defaults"
    max_positions: int | None = KIMI_K3_CONTEXT
    # Its own multi-token-prediction layers, what mtp drafts with (None: not published).
    mtp_layers: int | None = None
    # The classes its config.json declares: what vLLM will instantiate.
    architectures: tuple[str, ...] = ()
    # Heads of its linear-attention (KDA) layers, which shard over the tensor size too.
    linear_heads: int | None = None
    # Grouped-query attention's KV heads; None for MLA (Kimi-K3's), which vLLM does not
    # check parallelism against.
    kv_heads: int | None = None


@dataclass(frozen=True)
class DrafterFacts:
    architectures: tuple[str, ...]
    vocab_size: int | None
    draft_vocab_size: int | None
    n_predict: int | None
    target_layer_ids: tuple[int, ...] | None
    num_target_layers: int | None
    source: str
    model_type: str | None = None
    experts: int | None = None
    # Fields set true, and fields given as null: what a drafter's config class may refuse.
    set_flags: tuple[str, ...] = ()
    null_fields: tuple[str, ...] = ()
    # Fields given a value (a nested dflash_config's as "dflash_config.<field>").
    given: tuple[str, ...] = ()
    # Its attention heads, which shard over the draft's tensor size.
    attention_heads: int | None = None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def target_facts(config: Mapping[str, Any] | None, source: str = "config.json") -> TargetFacts:
    if not config:
        return TargetFacts()
    text = config.get("text_config") or config
    return TargetFacts(
        attention_heads=_int(text.get("num_attention_heads")) or KIMI_K3_HEADS,
        experts=_experts(text),
        vocab_size=_int(text.get("vocab_size")) or _int(config.get("vocab_size")) or KIMI_K3_VOCAB,
        hidden_layers=_int(text.get("num_hidden_layers")),
        source=source,
        max_positions=_int(text.get("max_position_embeddings"))
        or _int(config.get("max_position_embeddings")),
        # vLLM's kimi_linear config defaults it to 0.
        mtp_layers=_int(text.get("num_nextn_predict_layers")) or 0,
        linear_heads=_int((text.get("linear_attn_config") or {}).get("num_heads"))
        if isinstance(text.get("linear_attn_config"), Mapping)
        else None,
        architectures=tuple(
            str(a) for a in (config.get("architectures") or []) if isinstance(a, str)
        )
        if isinstance(config.get("architectures"), list)
        else (),
        kv_heads=_gqa_kv_heads(text),
    )


# The fields vLLM reads a model's expert count from (CONFIG_FIELD_ALIASES["num_experts"]).
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")


def _experts(text: Mapping[str, Any]) -> int:
    """The config's expert count; without any expert field a grouped-query model is dense (0,
    as vLLM reads it) and an MLA config is taken to have Kimi-K3's published count."""
    counts = (_int(text.get(name)) for name in EXPERT_FIELDS)
    found = next((count for count in counts if count), None)
    if found is not None:
        return found
    return 0 if _gqa_kv_heads(text) is not None else KIMI_K3_EXPERTS


def _gqa_kv_heads(text: Mapping[str, Any]) -> int | None:
    """The KV heads of a grouped-query config (num_key_value_heads, as many as the attention
    heads when absent); None for MLA, which a compressed KV (kv_lora_rank) marks."""
    if text.get("kv_lora_rank") is not None:
        return None
    return _int(text.get("num_key_value_heads")) or _int(text.get("num_attention_heads"))


def drafter_facts(
    config: Mapping[str, Any] | None, source: str = "config.json"
) -> DrafterFacts | None:
    if not config:
        return None
    layer_ids = config.get("target_layer_ids")
    return DrafterFacts(
        architectures=tuple(str(a) for a in config.get("architectures", []) or []),
        vocab_size=_int(config.get("vocab_size")),
        draft_vocab_size=_int(config.get("draft_vocab_size")),
        n_predict=_int(config.get("n_predict")),
        target_layer_ids=tuple(int(i) for i in layer_ids) if isinstance(layer_ids, list) else None,
        num_target_layers=_int(config.get("num_target_layers")),
        source=source,
        model_type=str(config["model_type"]) if config.get("model_type") else None,
        experts=_int(config.get("num_experts")) or _int(config.get("num_local_experts")),
        set_flags=tuple(sorted(str(k) for k, v in config.items() if v is True)),
        null_fields=tuple(sorted(str(k) for k, v in config.items() if v is None)),
        given=_given(config),
        attention_heads=_int(config.get("num_attention_heads")),
    )


def _given(config: Mapping[str, Any]) -> tuple[str, ...]:
    nested = config.get("dflash_config")
    inner = (
        [f"dflash_config.{k}" for k, v in nested.items() if v is not None]
        if isinstance(nested, Mapping)
        else []
    )
    return tuple(sorted([str(k) for k, v in config.items() if v is not None] + inner))
