"""A zoo of small Hugging Face transformers models, random weights, built offline.

Each Case builds a seeded model, a deterministic CPU batch and a loss. Sizes are small so
that a few training steps on the simulated neuron device take seconds, not minutes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import transformers
from torch import nn

Batch = dict[str, torch.Tensor]

VOCAB = 1000
SEQ = 17
PAD_AFTER = 12  # the second row of the padded text batch has this many real tokens
MODEL_SEED = 1234
BATCH_SEED = 5678


def default_loss(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The loss the model computes itself from `labels` in the batch."""
    return model(**batch).loss


def default_output(model: nn.Module, batch: Batch) -> torch.Tensor:
    """The logits of a forward over the batch."""
    return model(**batch).logits


@dataclass(frozen=True)
class Case:
    """One zoo entry: how to build its model and batch, and what to train and compare."""

    name: str
    build_model: Callable[[], nn.Module]
    build_batch: Callable[[], Batch]
    loss: Callable[[nn.Module, Batch], torch.Tensor] = default_loss
    output: Callable[[nn.Module, Batch], torch.Tensor] = default_output
    train_mode: bool = True  # False: the training steps run with model.eval() (e.g. BatchNorm)


def seeded(cls: type[nn.Module], config: Any) -> Callable[[], nn.Module]:
    """A builder of cls(config) with weights drawn after torch.manual_seed(MODEL_SEED)."""

    def build() -> nn.Module:
        torch.manual_seed(MODEL_SEED)
        return cls(config)

    return build


def _generator() -> torch.Generator:
    """The CPU generator every batch is drawn from."""
    return torch.Generator().manual_seed(BATCH_SEED)


def padded_text_batch() -> Batch:
    """2 x SEQ token ids; the second row is right-padded after PAD_AFTER tokens."""
    ids = torch.randint(3, VOCAB, (2, SEQ), generator=_generator())
    mask = torch.ones(2, SEQ, dtype=torch.long)
    mask[1, PAD_AFTER:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def text_batch() -> Batch:
    """2 x 16 token ids, no padding, labels = inputs (the model shifts them)."""
    ids = torch.randint(3, VOCAB, (2, 16), generator=_generator())
    return {"input_ids": ids, "labels": ids.clone()}


def masked_lm_batch() -> Batch:
    """2 x 16 token ids with about 15% replaced by [MASK]; labels only at those places."""
    g = _generator()
    ids = torch.randint(5, VOCAB, (2, 16), generator=g)
    masked = torch.rand(2, 16, generator=g) < 0.15
    masked[:, 3] = True  # at least one label per row
    labels = ids.masked_fill(~masked, -100)
    return {
        "input_ids": ids.masked_fill(masked, 4),
        "attention_mask": torch.ones(2, 16, dtype=torch.long),
        "token_type_ids": torch.zeros(2, 16, dtype=torch.long),
        "labels": labels,
    }


def seq2seq_batch() -> Batch:
    """Encoder ids 2 x 12 (second row padded after 9) and decoder labels 2 x 8."""
    g = _generator()
    ids = torch.randint(3, VOCAB, (2, 12), generator=g)
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    labels = torch.randint(3, VOCAB, (2, 8), generator=g)
    labels[1, 6:] = -100
    return {"input_ids": ids.masked_fill(mask == 0, 0), "attention_mask": mask, "labels": labels}


def image_batch() -> Batch:
    """4 RGB images of 32 x 32 and their class labels (10 classes)."""
    g = _generator()
    pixels = torch.randn(4, 3, 32, 32, generator=g)
    return {"pixel_values": pixels, "labels": torch.randint(0, 10, (4,), generator=g)}


def audio_batch() -> Batch:
    """2 log-mel spectrograms (16 bins x 32 frames) and decoder labels 2 x 8."""
    g = _generator()
    features = torch.randn(2, 16, 32, generator=g)
    labels = torch.randint(3, VOCAB, (2, 8), generator=g)
    return {"input_features": features, "labels": labels}


def llama_config() -> transformers.LlamaConfig:
    """2 layers, hidden 64, 4 query and 2 key/value heads, SDPA attention."""
    return transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        attn_implementation="sdpa",
    )


def gpt2_config() -> transformers.GPT2Config:
    """2 layers, hidden 64, 4 heads; tied input and output embeddings; dropout 0.1."""
    return transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=4,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=True,
    )


def t5_config() -> transformers.T5Config:
    """2 encoder and 2 decoder layers, d_model 64, 4 heads; dropout 0.1."""
    return transformers.T5Config(
        vocab_size=VOCAB,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        pad_token_id=0,
        decoder_start_token_id=0,
        eos_token_id=1,
    )


def bert_config() -> transformers.BertConfig:
    """2 layers, hidden 64, 4 heads; dropout 0.1."""
    return transformers.BertConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
    )


def vit_config() -> transformers.ViTConfig:
    """32 x 32 images in 8 x 8 patches, 2 layers, hidden 64, 4 heads, 10 classes."""
    return transformers.ViTConfig(
        image_size=32,
        patch_size=8,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        num_labels=10,
    )


def resnet_config() -> transformers.ResNetConfig:
    """Two stages of one basic block each (16 and 32 channels), BatchNorm, 10 classes."""
    return transformers.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=10
    )


def mixtral_config(experts: str | None = None) -> transformers.MixtralConfig:
    """2 layers, hidden 64, 4 query / 2 key-value heads, 4 experts, 2 per token."""
    # experts: transformers' experts_implementation; None is its default (grouped_mm, which
    # calls torch.histc), "eager" a Python loop over the experts.
    return transformers.MixtralConfig(
        experts_implementation=experts,
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )


def whisper_config() -> transformers.WhisperConfig:
    """2 encoder and 2 decoder layers, d_model 64, 16 mel bins, 32 input frames."""
    return transformers.WhisperConfig(
        vocab_size=VOCAB,
        num_mel_bins=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        d_model=64,
        max_source_positions=16,
        max_target_positions=32,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        decoder_start_token_id=1,
        suppress_tokens=None,
        begin_suppress_tokens=None,
    )


def mamba_config() -> transformers.MambaConfig:
    """2 layers, hidden 64, state 8, the slow (pure PyTorch) selective scan."""
    return transformers.MambaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        state_size=8,
        num_hidden_layers=2,
        expand=2,
        conv_kernel=4,
        time_step_rank=8,
        pad_token_id=0,
    )


def gpt_neox_config() -> transformers.GPTNeoXConfig:
    """2 layers, hidden 64, 4 heads, partial rotary embeddings."""
    return transformers.GPTNeoXConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=64,
        pad_token_id=0,
    )


def mistral_config() -> transformers.MistralConfig:
    """2 layers, hidden 64, 4 query / 2 key-value heads, a sliding window of 8."""
    return transformers.MistralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        sliding_window=8,
        pad_token_id=0,
    )


def qwen2_config() -> transformers.Qwen2Config:
    """2 layers, hidden 64, 4 query / 2 key-value heads (biased q, k, v projections)."""
    return transformers.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
    )


def qwen3_config() -> transformers.Qwen3Config:
    """2 layers, hidden 64, 4 query / 2 key-value heads of 16, q/k RMSNorm."""
    return transformers.Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=64,
        pad_token_id=0,
    )


def phi_config() -> transformers.PhiConfig:
    """2 layers, hidden 64, 4 heads, half the head dimensions rotated."""
    return transformers.PhiConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=64,
        partial_rotary_factor=0.5,
        pad_token_id=0,
    )


def _cases() -> list[Case]:
    """Every zoo entry, in the order the CLI runs them."""
    t = transformers
    return [
        Case("llama", seeded(t.LlamaForCausalLM, llama_config()), padded_text_batch),
        Case("gpt2", seeded(t.GPT2LMHeadModel, gpt2_config()), padded_text_batch),
        Case("t5", seeded(t.T5ForConditionalGeneration, t5_config()), seq2seq_batch),
        Case("bert", seeded(t.BertForMaskedLM, bert_config()), masked_lm_batch),
        Case("vit", seeded(t.ViTForImageClassification, vit_config()), image_batch),
        Case("resnet_train", seeded(t.ResNetForImageClassification, resnet_config()), image_batch),
        Case(
            "resnet_eval",
            seeded(t.ResNetForImageClassification, resnet_config()),
            image_batch,
            train_mode=False,
        ),
        Case("mixtral", seeded(t.MixtralForCausalLM, mixtral_config()), padded_text_batch),
        Case(
            "mixtral_loop",
            seeded(t.MixtralForCausalLM, mixtral_config(experts="eager")),
            padded_text_batch,
        ),
        Case("whisper", seeded(t.WhisperForConditionalGeneration, whisper_config()), audio_batch),
        Case("mamba", seeded(t.MambaForCausalLM, mamba_config()), text_batch),
        Case("gpt_neox", seeded(t.GPTNeoXForCausalLM, gpt_neox_config()), padded_text_batch),
        Case("mistral", seeded(t.MistralForCausalLM, mistral_config()), padded_text_batch),
        Case("qwen2", seeded(t.Qwen2ForCausalLM, qwen2_config()), padded_text_batch),
        Case("qwen3", seeded(t.Qwen3ForCausalLM, qwen3_config()), padded_text_batch),
        Case("phi", seeded(t.PhiForCausalLM, phi_config()), padded_text_batch),
    ]


ZOO: dict[str, Case] = {case.name: case for case in _cases()}
