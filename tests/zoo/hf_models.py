"""The zoo's transformers architectures: small sizes, random weights, built offline from configs.

Each family shares a base config and a batch; a row names the model class (its config_class
gives the config) and what differs from the base. Classes are looked up when a model is built,
so that a worker imports only the transformers module of the model it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import transformers
from batches import (
    CLASSES,
    IMAGE,
    VOCAB,
    Batch,
    audio_batch,
    characters_batch,
    image_batch,
    image_text_batch,
    masked_lm_batch,
    padded_text_batch,
    segmentation_batch,
    seq2seq_batch,
    text_batch,
    waveform_batch,
)
from cases import Case, seeded
from torch import nn

TEXT: dict[str, Any] = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2}
ENCODER: dict[str, Any] = {
    **TEXT,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
}
DECODER: dict[str, Any] = {**ENCODER, "bos_token_id": 1, "eos_token_id": 2}
GQA = {"num_key_value_heads": 2}  # grouped-query attention: 4 query heads share 2 key/values
SEQ2SEQ: dict[str, Any] = {
    "vocab_size": VOCAB,
    "d_model": 64,
    "encoder_layers": 2,
    "decoder_layers": 2,
    "encoder_attention_heads": 4,
    "decoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
}
T5: dict[str, Any] = {  # relative position buckets instead of position embeddings
    "vocab_size": VOCAB,
    "d_model": 64,
    "d_kv": 16,
    "d_ff": 128,
    "num_heads": 4,
    "num_layers": 2,
    "pad_token_id": 0,
    "decoder_start_token_id": 0,
    "eos_token_id": 1,
}
VIT: dict[str, Any] = {
    "image_size": IMAGE,
    "patch_size": 8,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
}
RESNET: dict[str, Any] = {  # two stages of one basic block each, BatchNorm
    "embedding_size": 16,
    "hidden_sizes": [16, 32],
    "depths": [1, 1],
    "layer_type": "basic",
    "num_labels": CLASSES,
}
WAV2VEC2: dict[str, Any] = {
    **ENCODER,
    "vocab_size": 32,
    "hidden_size": 32,
    "intermediate_size": 64,
    "conv_dim": (16, 16),  # the conv front-end: 1600 samples -> 159 frames
    "conv_stride": (5, 2),
    "conv_kernel": (10, 3),
    "num_conv_pos_embeddings": 16,
    "num_conv_pos_embedding_groups": 4,
    "ctc_loss_reduction": "mean",
}
CLIP_TEXT: dict[str, Any] = {**DECODER, "hidden_size": 32, "intermediate_size": 64}
CLIP_VISION: dict[str, Any] = {**VIT, "hidden_size": 32, "intermediate_size": 64}


@dataclass(frozen=True)
class Arch:
    """One row: a transformers model class built from its config class with these arguments."""

    name: str
    family: str
    model: str  # the class's name in transformers
    batch: Callable[[], Batch]
    config: Mapping[str, Any]
    train_mode: bool = True

    def build(self) -> nn.Module:
        """The model, its weights drawn from the current torch seed."""
        cls = getattr(transformers, self.model)
        return cls(cls.config_class(**self.config))

    def case(self) -> Case:
        """The zoo entry of this row."""
        return Case(self.name, self.family, seeded(self.build), self.batch, self.train_mode)


def family(label: str, batch: Callable[[], Batch], base: Mapping[str, Any]) -> Callable[..., Arch]:
    """A row maker for one family: name, model class, and what differs from base."""

    def row(name: str, model: str, train_mode: bool = True, **config: Any) -> Arch:
        """The row of one architecture of this family."""
        return Arch(name, label, model, batch, {**base, **config}, train_mode)

    return row


decoder = family("decoder", padded_text_batch, DECODER)
encoder = family("encoder", masked_lm_batch, ENCODER)
seq2seq = family("encoder-decoder", seq2seq_batch, SEQ2SEQ)
vision = family("vision", image_batch, {"num_labels": CLASSES})
moe = family("moe", padded_text_batch, {**DECODER, **GQA})

ARCHS: tuple[Arch, ...] = (
    decoder("llama", "LlamaForCausalLM", attn_implementation="sdpa", **GQA),
    decoder("gpt2", "GPT2LMHeadModel", n_inner=128, tie_word_embeddings=True),
    decoder(
        "gpt_neo", "GPTNeoForCausalLM", attention_types=[[["global", "local"], 1]], window_size=8
    ),
    decoder("gpt_neox", "GPTNeoXForCausalLM"),
    decoder("opt", "OPTForCausalLM", ffn_dim=128, word_embed_proj_dim=64),  # tied
    decoder("bloom", "BloomForCausalLM"),  # ALiBi, tied
    decoder("falcon", "FalconForCausalLM"),  # multi-query, parallel attention, tied
    decoder("gemma", "GemmaForCausalLM", num_key_value_heads=1, head_dim=16),  # tied
    decoder("mistral", "MistralForCausalLM", sliding_window=8, **GQA),
    decoder("qwen2", "Qwen2ForCausalLM", **GQA),
    decoder("qwen3", "Qwen3ForCausalLM", head_dim=16, **GQA),
    decoder("phi", "PhiForCausalLM", partial_rotary_factor=0.5),
    decoder("phi3", "Phi3ForCausalLM", **GQA),
    decoder("stablelm", "StableLmForCausalLM", **GQA),
    decoder("olmo", "OlmoForCausalLM"),
    encoder("bert", "BertForMaskedLM"),
    encoder("roberta", "RobertaForMaskedLM", pad_token_id=1),
    encoder("albert", "AlbertForMaskedLM", embedding_size=32),
    encoder("distilbert", "DistilBertForMaskedLM", hidden_dim=128),
    encoder("electra", "ElectraForMaskedLM", embedding_size=32),
    # Characters hashed into embeddings, a strided conv that downsamples them, a deep
    # transformer on the short sequence, and an upsampling conv back to characters.
    Arch(
        "canine",
        "encoder",
        "CanineForTokenClassification",
        characters_batch,
        {
            **ENCODER,
            "num_labels": CLASSES,
            "num_hash_buckets": 64,
            "num_hash_functions": 2,
            "downsampling_rate": 4,
            "local_transformer_stride": 8,
            "max_position_embeddings": 128,
        },
    ),
    Arch("t5", "encoder-decoder", "T5ForConditionalGeneration", seq2seq_batch, T5),
    seq2seq("bart", "BartForConditionalGeneration"),
    seq2seq("marian", "MarianMTModel", decoder_start_token_id=0),
    vision("vit", "ViTForImageClassification", hidden_size=64, intermediate_size=128, **VIT),
    # Shifted windows with a continuous position bias (an MLP over log-spaced coordinates),
    # cosine attention, patch merging; drop path draws on the device.
    vision(
        "swinv2",
        "Swinv2ForImageClassification",
        image_size=IMAGE,
        patch_size=4,
        embed_dim=16,
        depths=[1, 1],
        num_heads=[2, 2],
        window_size=4,
    ),
    # Overlapping strided patch convolutions, attention over spatially reduced keys, a
    # depthwise conv in the MLP, and an all-MLP decode head with BatchNorm, upsampling and
    # dropout. drop_path_rate=0: drop path draws from the device's generator and dropout from
    # the CPU's, where the CPU reference draws both from one (README, "Known limits").
    Arch(
        "segformer",
        "vision",
        "SegformerForSemanticSegmentation",
        segmentation_batch,
        {
            "num_encoder_blocks": 2,
            "depths": [1, 1],
            "sr_ratios": [2, 1],
            "hidden_sizes": [16, 32],
            "num_attention_heads": [1, 2],
            "patch_sizes": [7, 3],
            "strides": [4, 2],
            "mlp_ratios": [2, 2],
            "decoder_hidden_size": 32,
            "num_labels": CLASSES,
            "drop_path_rate": 0.0,
        },
    ),
    vision("resnet_train", "ResNetForImageClassification", **RESNET),
    vision("resnet_eval", "ResNetForImageClassification", train_mode=False, **RESNET),
    Arch("wav2vec2", "speech", "Wav2Vec2ForCTC", waveform_batch, WAV2VEC2),
    # Conformer blocks (a depthwise convolution module with BatchNorm, rotary self-attention)
    # after a conv front-end normalised by LayerNorm over channels (the large checkpoints').
    Arch(
        "wav2vec2_conformer",
        "speech",
        "Wav2Vec2ConformerForCTC",
        waveform_batch,
        {
            **WAV2VEC2,
            "position_embeddings_type": "rotary",
            "conv_depthwise_kernel_size": 7,
            "feat_extract_norm": "layer",
            "do_stable_layer_norm": True,
        },
    ),
    Arch(
        "whisper",
        "speech",
        "WhisperForConditionalGeneration",
        audio_batch,
        {
            **SEQ2SEQ,
            "num_mel_bins": 16,
            "max_source_positions": 16,
            "max_target_positions": 32,
            "decoder_start_token_id": 1,
            "suppress_tokens": None,
            "begin_suppress_tokens": None,
        },
    ),
    Arch(
        "mamba",
        "ssm",
        "MambaForCausalLM",
        text_batch,
        {**TEXT, "state_size": 8, "expand": 2, "conv_kernel": 4, "time_step_rank": 8},
    ),
    # experts_implementation: None is transformers' default (grouped_mm, which calls
    # torch.histc), "eager" a Python loop over the experts.
    moe("mixtral", "MixtralForCausalLM", num_local_experts=4, num_experts_per_tok=2),
    moe(
        "mixtral_loop",
        "MixtralForCausalLM",
        num_local_experts=4,
        num_experts_per_tok=2,
        experts_implementation="eager",
    ),
    moe(
        "qwen2_moe",
        "Qwen2MoeForCausalLM",
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=64,
        output_router_logits=True,  # the load-balancing loss joins the training loss
    ),
    Arch(
        "clip",
        "multimodal",
        "CLIPModel",
        image_text_batch,
        {"text_config": CLIP_TEXT, "vision_config": CLIP_VISION, "projection_dim": 32},
    ),
)


def hf_cases() -> list[Case]:
    """The transformers entries of the zoo, in table order."""
    return [arch.case() for arch in ARCHS]
