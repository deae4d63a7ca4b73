"""The generic config shrinker: any transformers config class, cut to a model of typically a
few hundred thousand parameters (a few million at most) that keeps its architecture.

The shrinker reads the config class's own constructor: each argument whose name says what it
sizes (layers, width, heads, experts, vocabulary, image...) and whose default is a number (or
a list of them) gets a small value; everything else keeps its default, and values the
constructor derives (head_dim, layer_types...) are derived again from the small ones. A
composite config (text_config, vision_config, audio_config, encoder/decoder...) has each of
its parts shrunk the same way, by the part's own class.

Per-architecture overrides (OVERRIDES) are applied after the generic rules, only where those
fail, each with its reason.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from itertools import accumulate
from typing import Any

from transformers import PretrainedConfig

LAYERS = 2
HIDDEN = 64
HEADS = 4
KV_HEADS = 2
FFN = 128
HEAD_DIM = 16
VOCAB = 1024
POSITIONS = 512
IMAGE = 32
PATCH = 8
EXPERTS = 4
EXPERTS_PER_TOKEN = 2
STAGE_WIDTH = 16  # the first stage's width in a hierarchical vision model
CODEC_WIDTH = 128  # an audio codec's widest convolution (its last down-sampling stage)
SLIDING = 8  # a sliding window left to the checkpoint: half the sweep's text
SPECIAL_TOKENS = 32  # the top of the vocabulary is kept for special tokens (ids above VOCAB)

# Argument name -> small value. An argument is shrunk only when its default is larger.
LAYER_KEYS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "encoder_layers",
    "decoder_layers",
    "num_encoder_layers",
    "num_decoder_layers",
    "text_layers",
    "vision_layers",
    "num_blocks",
    "depth",
    "encoder_depth",
    "decoder_depth",
)
SIZES: dict[str, int] = {
    **dict.fromkeys(LAYER_KEYS, LAYERS),
    **dict.fromkeys(("attn_layer_period", "expert_layer_period"), 2),  # (Jamba's hybrid)
    **dict.fromkeys(("attn_layer_offset", "expert_layer_offset"), 1),
    **dict.fromkeys(
        (
            "hidden_size",
            "d_model",
            "n_embd",
            "embed_dim",
            "dim",
            "embedding_size",
            "word_embed_proj_dim",
            "projection_dim",
            "text_hidden_size",
            "vision_hidden_size",
            "encoder_hidden_size",
            "decoder_hidden_size",
            "proj_dim",
            "codebook_dim",
            "reassemble_hidden_size",  # a DPT neck reads the backbone's width under this name
            "out_hidden_size",
            "audio_hidden_size",  # a speech LM's head reads its audio encoder's width
            "condition_dim",  # a TTS flow head conditioned on its backbone's hidden state
            "vector_quantization_hidden_dimension",  # (Mimi: its codebooks are this wide)
            "backbone_hidden_size",  # a speech LM's depth decoder reads its backbone's width
            "vit_dim",  # (SAM-HQ: its mask decoder reads its ViT's width)
            "fpn_hidden_size",  # a SAM 2 or 3 neck: its decoders read its features at their width
            "mit_hidden_size",  # X-CLIP's frame transformer, as wide as the projection
            "output_dim",  # an audio encoder's projection into its text model's width (Qwen's)
            "cross_hidden_size",  # what a decoder's cross-attention reads: its encoder's width
            "hidden_size_global",  # (BLT: its local encoder and decoder read its global width)
            "projection_hidden_size",  # (Kimi K2.5's projector reads its vision tower's width)
        ),
        HIDDEN,
    ),
    **dict.fromkeys(
        (
            "num_attention_heads",
            "n_head",
            "n_heads",
            "num_heads",
            "encoder_attention_heads",
            "decoder_attention_heads",
            "num_encoder_attention_heads",
            "num_decoder_attention_heads",
            "cross_num_attention_heads",
            "cross_num_key_value_heads",  # (Dia's cross-attention: as many as its heads)
        ),
        HEADS,
    ),
    **dict.fromkeys(
        (
            "intermediate_size",
            "ffn_dim",
            "encoder_ffn_dim",
            "decoder_ffn_dim",
            "d_ff",
            "n_inner",
            "ffn_hidden_size",
            "mlp_dim",
            "decoder_intermediate_size",
            "encoder_intermediate_size",
            "mit_intermediate_size",
        ),
        FFN,
    ),
    **dict.fromkeys(
        (
            "head_dim",
            "d_kv",
            "attention_head_dim",
            "kv_channels",
            "linear_head_dim",
            "cross_head_dim",
        ),
        HEAD_DIM,
    ),
    # Multi-head latent attention (low-rank keys, values and queries; a rotary part of each head)
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 32),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim"), HEAD_DIM // 2),
    **dict.fromkeys(("v_head_dim",), HEAD_DIM),
    **dict.fromkeys(("max_length",), 64),  # audio spectrogram frames (AST)
    # Time series: the horizon predicted and the context read (None in the defaults: given
    # by the dataset)
    **dict.fromkeys(("prediction_length",), 4),
    **dict.fromkeys(("num_frames",), 4),  # a video's frames
    **dict.fromkeys(("num_queries",), 8),  # a detector's object queries (its top-k of anchors)
    **dict.fromkeys(("latent_query_num",), 8),  # an image's tokens from a resampler (Kosmos-2)
    **dict.fromkeys(("encoder_hidden_dim",), 32),  # a detector's hybrid encoder (RT-DETR)
    **dict.fromkeys(("context_length",), 16),
    **dict.fromkeys(("patch_length", "patch_stride"), 4),
    **dict.fromkeys(("mask_time_length", "mask_feature_length"), 2),  # SpecAugment spans
    **dict.fromkeys(("num_groups",), 8),  # GroupNorm groups (BiT)
    **dict.fromkeys(("window_size",), 4),  # windowed attention (Swin: 8 x 8 patches)
    **dict.fromkeys(("upsample_initial_channel",), 32),  # a HiFi-GAN vocoder's first width
    **dict.fromkeys(("num_windows",), 4),  # windows per image, a square (LW-DETR's ViT)
    # Layers that reuse an earlier layer's keys and values: none, in two layers of two kinds
    **dict.fromkeys(("num_kv_shared_layers",), 0),
    **dict.fromkeys(
        (
            "vocab_size",
            "text_vocab_size",
            "src_vocab_size",
            "tgt_vocab_size",
            "vocab_size_per_layer_input",
            "encoder_hash_byte_group_vocab",  # (BLT's hashed byte n-gram embeddings)
            "unpadded_vocab_size",  # (Inkling 2's head: the vocabulary before its padding)
        ),
        VOCAB,
    ),
    # Sliding-window layers with heads of their own (Inkling 2)
    **dict.fromkeys(("swa_num_attention_heads",), HEADS),
    **dict.fromkeys(("swa_num_key_value_heads",), KV_HEADS),
    **dict.fromkeys(("swa_head_dim",), HEAD_DIM),
    **dict.fromkeys(
        ("max_position_embeddings", "n_positions", "max_seq_len", "max_sequence_length"),
        POSITIONS,
    ),
    **dict.fromkeys(
        ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), EXPERTS
    ),
    **dict.fromkeys(
        (
            "num_experts_per_tok",
            "num_experts_per_token",
            "moe_topk",
            "top_k",
            "moe_k",
            "top_k_experts",
        ),
        EXPERTS_PER_TOKEN,
    ),
    **dict.fromkeys(("n_shared_experts", "moe_num_shared_experts", "num_shared_experts"), 1),
    # Grouped routing: the experts split into groups, the best groups chosen first
    **dict.fromkeys(("n_group", "num_expert_group"), 2),
    **dict.fromkeys(("topk_group",), 1),
    **dict.fromkeys(("moe_intermediate_size", "expert_intermediate_size"), FFN // 4),
    **dict.fromkeys(("shared_expert_intermediate_size",), FFN // 2),
    **dict.fromkeys(("image_size", "img_size"), IMAGE),
    **dict.fromkeys(("patch_size",), PATCH),
}
# Lists sized per stage (hierarchical vision models): name -> what each stage becomes.
STAGE_LISTS: dict[str, str] = {
    "depths": "one",
    "hidden_sizes": "width",
    "embed_dims": "width",
    "dims": "width",
    "channels": "width",
    "hidden_dims": "width",
    "num_heads": "heads",
    "num_attention_heads": "heads",
    "conv_dim": "flat",  # a speech model's convolutional front-end
    "tdnn_dim": "flat",
    "blocks_per_stage": "one",  # (Hiera: SAM 2's backbone)
    "num_attention_heads_per_stage": "heads",
}
TIMM = ("timm_backbone", "timm_wrapper")
# Models that read a timm backbone's own output (EdgeTAM: timm's features_only list of stage
# maps as last_hidden_state), or its config (FastVLM's projector reads its width as hidden_size,
# Perception LM's as model_args["embed_dim"]), which no transformers backbone gives: their timm
# part is kept, and they need timm as their checkpoints do.
READS_TIMM = ("edgetam_vision_model", "fast_vlm", "perception_lm")
LAYER_INDICES = ("_layer_indices", "_layers_idx", "_idxs", "_layer_ids", "_attn_indexes")
# Offline: never a pretrained backbone from the hub, never timm's (not installed).
OFFLINE = {"use_pretrained_backbone": False, "use_timm_backbone": False}
# Randomness that the CPU reference and the device draw in different orders.
ZEROED = (
    "drop_path_rate",
    "layerdrop",
    "encoder_layerdrop",
    "decoder_layerdrop",
    "noise_scale",  # (VITS: noise drawn on the device scales its durations and its waveform)
    "noise_scale_duration",
)
# Dropout: a model's own dropout (DeBERTa's XDropout: bernoulli_ on the device) draws from the
# device's generator where the CPU reference draws from the CPU's, so its masks differ and the
# runs cannot be compared; F.dropout's masks are the CPU's, and the zoo covers them.
DROPOUT = ("dropout", "pdrop", "drop_prob")
# Values a config derives from its sizes when they are not given.
DERIVED = ("head_dim", "layer_types", "num_key_value_heads", "transformers_version")
# A modality's placeholder token, which a config may leave to the checkpoint (None)
MODALITY_TOKENS = (
    "image_token_id",
    "image_token_index",
    "audio_token_id",
    "audio_token_index",
)
TOKEN_ID_SUFFIXES = ("_token_id", "_token_index", "_token_ids")

# PP-OCR detectors' neck: the kernel, stride and padding of each convolution of an intra-class
# block (their default is None: every checkpoint gives them), as transformers' tests give them.
INTRACLASS_BLOCK = {
    "reduce_channel": [1, 1, 0],
    "return_channel": [1, 1, 0],
    "vertical_long_to_small_conv_longratio": [[7, 1], [1, 1], [3, 0]],
    "vertical_long_to_small_conv_midratio": [[5, 1], [1, 1], [2, 0]],
    "vertical_long_to_small_conv_shortratio": [[3, 1], [1, 1], [1, 0]],
    "horizontal_small_to_long_conv_longratio": [[1, 7], [1, 1], [0, 3]],
    "horizontal_small_to_long_conv_midratio": [[1, 5], [1, 1], [0, 2]],
    "horizontal_small_to_long_conv_shortratio": [[1, 3], [1, 1], [0, 1]],
    "symmetric_conv_long_longratio": [[7, 7], [1, 1], [3, 3]],
    "symmetric_conv_long_midratio": [[5, 5], [1, 1], [2, 2]],
    "symmetric_conv_long_shortratio": [[3, 3], [1, 1], [1, 1]],
}
# A PP-LCNetV4 backbone as PP-OCRv6's detectors read it (transformers' tests' own): every stage
# an output (its default outputs the last alone, where their necks read one per stage), and
# its blocks (kernel, in, out, stride, squeeze-excitation), where its widths are, 16 wide.
PP_LCNET_V4 = {
    "model_type": "pp_lcnet_v4",
    "out_features": ["stage1", "stage2", "stage3", "stage4"],
    "stem_channels": [3, 16, 16],
    "block_configs": [
        [[3, 16, 16, 1, True]],
        [[3, 16, 16, 2, False], [3, 16, 16, 1, False]],
        [[3, 16, 16, 2, False], [3, 16, 16, 1, True]],
        [[3, 16, 16, 2, False], [5, 16, 16, 1, True], [5, 16, 16, 1, False]],
    ],
}
PP_OCR_NECK = {
    "intraclass_block_config": INTRACLASS_BLOCK,
    "scale_factor_list": [1, 2, 4, 8],
    "kernel_list": [3, 2, 2],
    "neck_out_channels": 32,
}
IMAGE_CODES = 256  # a VQ image tokenizer's codebook (each code a token of the vocabulary)


def _image_vocabulary(codes: int) -> dict[str, int]:
    """Chameleon's vocabulary map: "<image>" and one "IMGIMG<code in letters A-J>Z" token per
    VQ code, just below the special tokens at the top of the small vocabulary."""
    first = VOCAB - SPECIAL_TOKENS - codes
    names = {
        f"IMGIMG{''.join(chr(ord('A') + int(d)) for d in str(i))}Z": first + i for i in range(codes)
    }
    return {"<image>": first - 1, **names}


# model_type -> (extra arguments, why the generic rules are not enough).
OVERRIDES: dict[str, tuple[dict[str, Any], str]] = {
    "bamba": ({"attn_layer_indices": [1]}, "its default has no attention layer at all"),
    "xmod": ({"default_language": "en_XX"}, "its adapters need a language; checkpoints set one"),
    "lfm2_moe": ({"layer_types": ["conv", "full_attention"]}, "its default has no layer types"),
    "mamba2": ({"num_heads": 8, "n_groups": 1}, "SSM heads x head_dim must be expand x hidden"),
    "llama4": ({"pad_token_id": 0}, "its model reads the composite config's pad_token_id"),
    "emu3": ({"pad_token_id": 0}, "its model reads the composite config's pad_token_id"),
    "gemma4_assistant": (
        {
            "text_config": {
                "hidden_size_per_layer_input": 0,
                "vocab_size_per_layer_input": 0,
                "enable_moe_block": False,
                "use_double_wide_mlp": False,
            }
        },
        "its default text config (Gemma 4's) fails its own checks: no per-layer inputs, no MoE",
    ),
    "cohere_compass_text": (
        {"rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}},
        "its rotary embedding reads rope parameters per layer type, which its default leaves empty",
    ),
    "cohere_compass": (
        {
            "text_config": {
                "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e4}}
            }
        },
        "as cohere_compass_text",
    ),
    "fun_asr_nano": (
        {"adaptor_config": {"intermediate_size": HIDDEN // 4}},
        "its adaptor's width must be a quarter of the text model's, a relation no rule knows",
    ),
    "kyutai_speech_to_text": (
        {"audio_pad_token_id": VOCAB + 32 * 2049, "audio_bos_token_id": 2048},
        (
            "its audio ids index the codebooks (32 of 2049 codes) after the text in one "
            "embedding, where its pad is the last row and its BOS a code, not text ids"
        ),
    ),
    "gemma4_audio": (
        {"num_mel_bins": 128},
        (
            "its subsampling's projection reads the mel bins as its first conv width (128, its "
            "feature extractor's bins), which the config does not name: the inputs' bins"
        ),
    ),
    "granite_speech": (
        {"window_size": 15, "encoder_config": {"hidden_dim": HIDDEN}},
        (
            "its projector pools each window of window_size frames into window_size // "
            "downsample_rate queries: the default's 15 frames (3 queries), not Swin's 4 patches; "
            "its encoder's width is hidden_dim, a name that is a stage's width elsewhere"
        ),
    ),
    "granite_speech_plus": (
        {"window_size": 15, "encoder_config": {"hidden_dim": HIDDEN}},
        "as granite_speech",
    ),
    "esm": (
        {"vocab_size": 33, "pad_token_id": 1, "mask_token_id": 32},
        "its default has no vocabulary (a protein alphabet is given by the checkpoint)",
    ),
    "dbrx": (
        {"attn_config": {"kv_n_heads": 2, "rope_theta": 10000.0, "clip_qkv": 8.0}},
        (
            "its attention reads attn_config.rope_theta, which its config class no longer sets, "
            "and clamps to clip_qkv, whose default (None) torch.clamp refuses"
        ),
    ),
    "cvt": (
        {"depth": [1, 2, 3]},
        "stage i reads rate i of its own depth[i] drop-path rates, so it needs i + 1 layers",
    ),
    "align": (
        {
            "projection_dim": 80,
            "vision_config": {
                "width_coefficient": 0.25,
                "depth_coefficient": 0.25,
                "hidden_dim": 320,
            },
        },
        (
            "its EfficientNet is B7 as efficientnet's is (below), and its text projection must be "
            "as wide as the image embedding, EfficientNet's last width (80 at this width)"
        ),
    ),
    "vitmatte": (
        {
            "fusion_hidden_sizes": [64, 32, 16, 8],
            "backbone_config": {"model_type": "vitdet", "patch_size": 16},
        },
        (
            "its default is a tuple, which its model prepends a list to (a transformers bug); its "
            "fusion upsamples the ViT's patches x2 per detail stage (3, each half the size): the "
            "patches must stay 16 pixels"
        ),
    ),
    "qwen2_5_omni_thinker": (
        {"vision_start_token_id": VOCAB - SPECIAL_TOKENS},
        "its model reads vision_start_token_id, which only the composite Qwen2.5-Omni config sets",
    ),
    "qwen3_omni_moe_thinker": (
        {"vision_start_token_id": VOCAB - SPECIAL_TOKENS},
        "as qwen2_5_omni_thinker",
    ),
    "reformer": (
        {
            "axial_pos_shape": [4, 4],
            "axial_pos_embds_dim": [HIDDEN // 4, HIDDEN * 3 // 4],
            "lsh_attn_chunk_length": 8,
            "local_attn_chunk_length": 8,
        },
        (
            "in training its text must be exactly as long as its grid of axial positions (64 x 64 "
            "by default), whose two widths add up to the hidden size; its chunks are cut to fit"
        ),
    ),
    "pp_ocrv5_server_det": (
        PP_OCR_NECK,
        (
            "its neck's block layout, upsampling factors and head kernels default to None "
            "(checkpoints give them); its 256-wide neck is not named as a width"
        ),
    ),
    "pp_ocrv6_medium_det": (
        {**PP_OCR_NECK, "backbone_config": PP_LCNET_V4},
        "as pp_ocrv5_server_det, and its backbone's widths are in its block list (PP_LCNET_V4)",
    ),
    "pp_ocrv6_small_det": (
        {
            "backbone_config": PP_LCNET_V4,
            "layer_list_out_channels": [16, 16, 16, 16],
            "neck_out_channels": 32,
        },
        (
            "its neck reads one stage of its backbone each, as wide as layer_list_out_channels "
            "says: the backbone's widths are in its block list (PP_LCNET_V4)"
        ),
    ),
    "pp_doclayout_v2": (
        {"class_thresholds": [0.5, 0.5], "class_order": [0, 1]},
        (
            "its reading-order head reads a score threshold and an order for each of its labels "
            "(two by default), which its default leaves None (checkpoints give them)"
        ),
    ),
    "pp_doclayout_v3": (
        {"x4_feat_dim": 32},
        "its mask branch reads its backbone's first stage, as wide as x4_feat_dim must say (32 small)",
    ),
    "uvdoc": (
        {
            "backbone_config": {
                "model_type": "uvdoc_backbone",
                "out_features": [f"stage{i}" for i in range(1, 7)],
            }
        },
        "its bridge concatenates every stage of its backbone, whose default outputs the last alone",
    ),
    "lilt": (
        {"hidden_size": 96},
        "its layout embedding concatenates 6 slices of a sixth of the hidden size each",
    ),
    "perceiver": (
        {
            "d_latents": HIDDEN,
            "num_latents": 16,
            "num_self_attends_per_block": LAYERS,
            "max_position_embeddings": 16,
        },
        (
            "its latents' width, count and self-attention layers have names of their own; its "
            "masked-LM decoder queries max_position_embeddings positions, as long as the text "
            "must be (the sweep's 16 tokens)"
        ),
    ),
    "superglue": (
        {
            "keypoint_detector_config": {
                "model_type": "superpoint",
                "descriptor_decoder_dim": HIDDEN,
            }
        },
        "it matches its keypoint detector's descriptors, which must be as wide as its hidden size",
    ),
    "depth_pro": (
        {"intermediate_hook_ids": [LAYERS - 1, 0]},
        "its fusion reads these layers of its patch encoder (a part), which the small one must have",
    ),
    "efficientloftr": (
        {"num_attention_heads": 8, "num_key_value_heads": 8},
        (
            "its 2-D rotary embedding fills half the hidden size with 4 heads' worth of "
            "frequencies (partial_rotary_factor 4): a head must stay an eighth of it, 8 heads"
        ),
    ),
    "chmv2": (
        {"backbone_config": {"return_class_token": True}},
        (
            "its head reads the class token of each backbone stage, which its default sets outside "
            "DINOv3's own arguments (so the part's shrunk arguments lose it)"
        ),
    ),
    "qwen4_exp_text": (
        {"indexer_n_heads": HEADS, "indexer_kv_heads": 1, "indexer_head_dim": HEAD_DIM}
        | {"indexer_budget": 8, "indexer_compress_ratio": 4},
        "its attention layers always build a QSA indexer, whose sizes its default leaves unset",
    ),
    "xlstm": (
        {"hidden_size": 128},
        "its state's query width is hidden x qk_dim_factor rounded up to 64, its layers' is not",
    ),
    "recurrent_gemma": (
        {"block_types": ["recurrent", "attention"]},
        "its layers cycle through block_types (2 recurrent, 1 attention): 2 layers had no attention",
    ),
    "zamba": (
        {"num_hidden_layers": 3, "layers_block_type": ["linear_attention", "hybrid", "hybrid"]},
        "its hybrid layers share one attention block, tied from the first: it needs two of them",
    ),
    "blt": (
        {"use_cache": False},
        "its cache is built from the composite config, which has no num_hidden_layers (a bug)",
    ),
    "dory": (
        {"num_hidden_layers": 3, "n_input_layers": 1, "n_output_layers": 1}
        | {"layer_types": ["sliding_attention", "full_attention", "sliding_attention"]},
        (
            "its to_dict writes each layer as two blocks (attention, mlp), doubling the counts; "
            "its layers are input, looped and output groups: one layer each"
        ),
    ),
    "kolibri1_1": (
        {
            "num_hidden_layers": 3,
            "layer_types": ["sliding_attention", "indexed_attention", "indexed_attention"],
            "mlp_only_layers": [0],  # (then a mixture of experts)
            "index_layers": [1],  # (then a reindexer)
            "kv_source_layers": [0, 1, 1],  # (the reindexer reads the indexer's keys and values)
            "sliding_window": SLIDING,
            "mlp_only_intermediate_size": FFN,
        }
        | {"index_topk": 4, "index_pool_size": 8, "index_compression": 2, "index_num_heads": 2}
        | {"index_num_local_tokens": 4, "index_num_sink_tokens": 1},
        (
            "its layers refer to each other by index (indexers, reindexers, layers reading another's "
            "keys and values), which no cut of its lists keeps; its sparse pools are cut to the text"
        ),
    ),
    "apertus1p5": (
        {
            "image_token_offset": 480,
            "audio_token_offset": 736,
            "vision_config": {"codebook_size": 256, "base_channels": 32, "latent_channels": 32},
            "audio_config": {"codebook_size": 256},
        },
        (
            "its vocabulary holds text, then its image codebook, then its audio codebook, at "
            "offsets no rule knows: each codebook 256 codes of the small vocabulary"
        ),
    ),
    "t5gemma2_encoder": (
        {"text_config": {"dropout_rate": 0.0}},
        "its layers read dropout_rate, which only the composite T5Gemma 2 config sets on its text",
    ),
    "moonshine_streaming": (
        {"num_key_value_heads": HEADS},
        "its decoder reads num_key_value_heads, which its config class does not define",
    ),
    "xcodec": (
        {"codebook_dim": 256 + HIDDEN},
        "its codebooks are as wide as its acoustic (DAC's, 256) and semantic widths together",
    ),
    "neucodec": (
        {"quantization_dim": 2 * HIDDEN},
        "its quantizer reads its semantic and acoustic features together: twice its hidden size",
    ),
    "chameleon": (
        {
            "vocabulary_map": _image_vocabulary(IMAGE_CODES),
            "vq_config": {"num_embeddings": IMAGE_CODES},
        },
        "its image codes are tokens named in a vocabulary map, which only checkpoints carry",
    ),
    "longcat_flash": (
        {"head_dim": HEAD_DIM // 2},
        "its rotary embedding is head_dim wide, which must be qk_rope_head_dim (as its default)",
    ),
    "muse_spark": (
        {
            "out_hidden_size": HIDDEN * 4,
            "projector_hidden_size": FFN,
            "text_config": {"moe_hidden_size": HIDDEN},
        },
        (
            "its vision output is its width x 4 (2 x 2 patches merged, no projection), a relation "
            "no rule knows; its projector and its experts' width have names of their own"
        ),
    ),
    "muse_glimmer": (
        {"out_hidden_size": HIDDEN * 4, "projector_hidden_size": FFN},
        "as muse_spark (its text model has no experts)",
    ),
    "granite4_vision": (
        {
            "downsample_rate": "1/2",
            "deepstack_layer_map": [[-2, 0], [-1, 1]],
            "spatial_target_layers": [0, 0, 1, 1],
        },
        (
            "its default leaves its projectors to the checkpoint (no deepstack map, no downsample "
            "rate) and injects its spatial features at text layers 12-21"
        ),
    ),
    "hunyuan_vl_text": (
        {"rope_parameters": {"mrope_section": [HEAD_DIM // 8] * 4}},
        "its default has no M-RoPE sections, which its checkpoints set (it needs 3 axes or more)",
    ),
    "hunyuan_vl": (
        {
            "text_config": {"rope_parameters": {"mrope_section": [HEAD_DIM // 8] * 4}},
            "vision_config": {"max_image_size": IMAGE * 4, "min_image_size": IMAGE},
        },
        "as hunyuan_vl_text; its position table covers its largest image (2048 pixels)",
    ),
    "deepseek_ocr2": (
        {
            "text_config": {"mlp_layer_types": ["dense", "sparse"]},
            "vision_config": {"sam_config": {"downsample_channels": [HIDDEN // 2, HIDDEN]}},
        },
        (
            "its default leaves each layer's MLP kind to the checkpoint (dense first, then "
            "experts), and its SAM neck's last width (896) must be its vision encoder's width"
        ),
    ),
    "efficientnet": (
        {"width_coefficient": 0.25, "depth_coefficient": 0.25, "hidden_dim": 320},
        "its default is EfficientNet-B7 (width x2, depth x3.1); hidden_dim follows the width",
    ),
    "instructblipvideo": (
        {"video_token_index": VOCAB - SPECIAL_TOKENS},
        "its video token is left to the checkpoint (None), and no image token takes its place",
    ),
    "molmo2": (
        {"image_patch_id": VOCAB + 2},
        (
            "its image token is image_patch_id (a name no rule reads), in its additional vocabulary"
            " after the text's, as its default (vocabulary + 2)"
        ),
    ),
    "omdet-turbo": (
        {
            "backbone_config": {
                "model_type": "swin",
                "embed_dim": STAGE_WIDTH,
                "depths": [1, 1, 1, 1],
                "num_heads": [1, 2, 4, 8],
                "window_size": 4,
                "out_features": ["stage2", "stage3", "stage4"],
                "drop_path_rate": 0.0,  # (ZEROED: the generic rules shrank the ResNet it replaces)
            },
            "apply_layernorm_after_vision_backbone": False,
            "decoder_num_layers": LAYERS,
            "decoder_dim_feedforward": FFN,
            "encoder_dim_feedforward": FFN,
            "task_encoder_hidden_dim": FFN,
        }
        | dict.fromkeys(("d_model", "decoder_hidden_dim"), HIDDEN // 2)
        | {"vision_features_channels": [HIDDEN // 2] * 3}  # (its encoder's outputs, d_model wide)
        | dict.fromkeys(
            ("text_projection_in_dim", "text_projection_out_dim", "class_embed_dim"), HIDDEN
        ),
        (
            "its backbone is timm's Swin (not installed), whose channels-last stages it normalises "
            "itself: transformers' Swin, which normalises its stages itself, as wide as its encoder"
            " reads; its decoder's and text embeddings' widths have names of their own: its class "
            "and task embeddings are its text model's width, its decoder narrower (half, as its "
            "default's 256 of 512: where they are equal it builds no projection between them)"
        ),
    ),
    "seggpt": (
        {
            "image_size": [2 * IMAGE, IMAGE],
            "merge_index": 0,
            "intermediate_hidden_state_indices": [0, 1],
        },
        (
            "its image is its prompt above its input, twice as high as wide (896 x 448); it merges "
            "the two at layer merge_index and decodes the layers it lists, which 2 layers must have"
        ),
    ),
    "lw_detr": (
        {"projector_scale_factors": [1.0]},
        (
            "its default has no feature level for its decoder (no projector scale: checkpoints give"
            " them, one level at scale 1 for LW-DETR's smaller ones)"
        ),
    ),
    "glm_image": (
        {
            "vq_config": {"latent_channels": HIDDEN, "num_embeddings": IMAGE_CODES},
            "text_config": {"vision_vocab_size": IMAGE_CODES + 128},
        },
        (
            "its VQ tokenizer reads its vision encoder's features (latent_channels: their width), "
            "and its codes are token ids of the text: a codebook within the small vocabulary, and "
            "its head's vision vocabulary the codebook and 128 more, as its default's"
        ),
    ),
    "ernie4_5_vl_moe": (
        {
            "text_config": {
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 5e5,
                    "mrope_section": [3, 3, 2],
                }
            }
        },
        (
            "its rotary embedding's sections default in its model code (22, 22, 20: a head of 128),"
            " not in its config, so no error names them: the small head's (16) in the same "
            "proportions"
        ),
    ),
    "shieldgemma2": (
        {"yes_token_index": 100, "no_token_index": 101},
        (
            "its classes are the logits of its Yes and No tokens, at ids of Gemma's vocabulary "
            "(10784, 3771) that its model takes unless its config names them (the small one's "
            "words)"
        ),
    ),
    "clap": (
        {
            "audio_config": {
                "patch_embeds_hidden_size": HIDDEN // 8,
                "spec_size": 128,
                "num_mel_bins": 32,
            }
        },
        (
            "its Swin doubles its patch width over its 4 stages up to its hidden size (96 x 8 = "
            "768), and reads the spectrogram as an image of spec_size pixels (4 x its mel bins), "
            "whose last stage (spec_size / 32 patches a side) must hold a window"
        ),
    ),
    "clvp": (
        {
            "text_config": {"num_attention_heads": 2},
            "speech_config": {"num_attention_heads": 2, "vocab_size": VOCAB},
        },
        (
            "its encoders' rotary embedding is 32 wide at least, which a head must hold (2 heads); "
            "its speech encoder reads the codes its decoder predicts (the argmax of its logits): "
            "its vocabulary must be the decoder's, where its default is 256 codes against 8194"
        ),
    ),
}
OVERRIDES["xcodec2"] = (OVERRIDES["neucodec"][0], "as neucodec")
OVERRIDES["qwen4_exp"] = ({"text_config": OVERRIDES["qwen4_exp_text"][0]}, "as qwen4_exp_text")


def _stage_list(kind: str, n: int) -> list[int]:
    """A per-stage list of n small values."""
    if kind == "one":
        return [1] * n
    if kind == "flat":
        return [32] * n
    if kind == "heads":
        return [min(2**i, HEADS) for i in range(n)]
    return [32 * 2 ** min(i, 2) for i in range(n)]


def _arguments(cls: type) -> dict[str, Any]:
    """The config constructor's keyword arguments and their defaults (inspect.Parameter.empty
    where there is none)."""
    params = inspect.signature(cls.__init__).parameters
    return {n: p.default for n, p in params.items() if n != "self" and p.kind != p.VAR_KEYWORD}


def _is_int(value: Any) -> bool:
    """A plain int (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _shrunk_value(name: str, default: Any) -> Any:
    """The small value of one argument, or the default when the rules leave it."""
    random = name in ZEROED or any(part in name for part in DROPOUT)
    if random and isinstance(default, float | int) and not isinstance(default, bool) and default:
        return 0.0
    stages = isinstance(default, list | tuple) and default and all(_is_int(v) for v in default)
    if name in STAGE_LISTS and stages:
        return _stage_list(STAGE_LISTS[name], len(default))
    if name in SIZES and _is_int(default) and default > SIZES[name]:
        return SIZES[name]
    if name in SIZES and stages and name not in STAGE_LISTS:  # one size per layer
        return [min(v, SIZES[name]) for v in default]
    if name == "head_dim" and default is None:
        return HEAD_DIM  # (some attention classes read head_dim even when the config left it None)
    if name in SIZES and default is None and name not in DERIVED:
        return SIZES[name]  # a size the full config leaves to be given (no default)
    if name in ("image_size", "patch_size") and isinstance(default, list | tuple):
        return [SIZES[name]] * len(default)
    return default


def _token_ids(current: Mapping[str, Any], vocab: int) -> dict[str, Any]:
    """Special token ids beyond the small vocabulary, moved to its top (distinct ids)."""
    moved: dict[str, Any] = {}
    top = vocab - 1
    for name, value in current.items():
        if not name.endswith(TOKEN_ID_SUFFIXES):
            continue
        if value is None and name in MODALITY_TOKENS:  # left to the checkpoint: one is needed
            moved[name], top = top, top - 1
        if _is_int(value) and value >= vocab:
            moved[name], top = top, top - 1
        elif isinstance(value, list) and any(_is_int(v) and v >= vocab for v in value):
            moved[name] = []
            for v in value:
                moved[name].append(top if _is_int(v) and v >= vocab else v)
                top -= 1
    return moved


def parts_of(config: PretrainedConfig) -> dict[str, PretrainedConfig]:
    """The config's parts that are configs themselves (text_config, vision_config...)."""
    return {
        name: value
        for name, value in vars(config).items()
        if isinstance(value, PretrainedConfig) and not name.startswith("_")
    }


def shrunk_arguments(config: PretrainedConfig) -> dict[str, Any]:
    """The constructor arguments of a small config like this one (its parts as dicts)."""
    cls = type(config)
    current = config.to_dict()
    kwargs: dict[str, Any] = {}
    for name, default in _arguments(cls).items():
        value = current.get(name, default)
        if value is inspect.Parameter.empty:
            continue
        small = _shrunk_value(name, value)
        if small is not value and small != value:
            kwargs[name] = small
    kwargs.update(_kv_heads(current))
    kwargs.update(_pixel_window(current, kwargs))
    kwargs.update(_stage_windows(current, kwargs))
    kwargs.update(_depthwise_groups(current, kwargs))
    kwargs.update(_codec_widths(current))
    outs, hidden = current.get("out_features"), current.get("hidden_size")
    stages = isinstance(outs, list) and outs and all(_is_int(v) for v in outs)
    if stages and hidden == outs[-1] and "hidden_size" in kwargs:  # (its last stage's width)
        kwargs["out_features"] = [min(v, kwargs["hidden_size"]) for v in outs]
    if current.get("sliding_window", 0) is None and isinstance(current.get("layer_types"), list):
        # A window left to the checkpoint, which only layers of the sliding type read.
        kwargs["sliding_window"] = SLIDING
    kwargs.update(_feature_layers(current))
    if isinstance(current.get("depths"), list) and _is_int(current.get("embed_dim")):
        kwargs["embed_dim"] = STAGE_WIDTH  # a hierarchy of stages doubles it at each stage
    kwargs.update({k: v for k, v in OFFLINE.items() if current.get(k) is True})
    kwargs.update(_rotary_dim(current, kwargs))
    kwargs.update(_per_layer(current, kwargs))
    kwargs.update(_kv_heads_per_layer(current, kwargs))
    if "stage_out_channels" in _arguments(cls):  # (else derived from its blocks: PP-LCNet's)
        kwargs.update(_chained_stages(current, kwargs))
    kwargs.update(_hiera_stages(current, kwargs))
    kwargs.update(_backbone_outputs(current, kwargs))
    kwargs.update(_stem_width(current, kwargs))
    kwargs.update(_layout_widths(current, kwargs))
    if current.get("is_encoder_decoder") and current.get("decoder_start_token_id") is None:
        # Needed to shift labels right; checkpoints carry it in their generation config.
        kwargs["decoder_start_token_id"] = current.get("pad_token_id") or 0
    if current.get("is_encoder_decoder") and current.get("pad_token_id", 0) is None:
        kwargs["pad_token_id"] = 0  # (labels shifted right are padded with it)
    vocab = kwargs.get("vocab_size", current.get("vocab_size"))
    parts = parts_of(config)
    if not _is_int(vocab) and any(_is_int(getattr(p, "vocab_size", None)) for p in parts.values()):
        vocab = VOCAB  # a composite config's token ids index its text part's vocabulary
    if _is_int(vocab):
        kwargs.update(_token_ids(current, vocab))
    for name, part in parts.items():
        if part.model_type in TIMM and config.model_type not in READS_TIMM:
            kwargs[name] = _resnet_backbone(part)
            continue
        small = {**_customised(part), **shrunk_arguments(part)}
        if small:  # (a part left as it is stays the object the config made)
            kwargs[name] = {"model_type": part.model_type, **small}
    kwargs.update(_encoder_inputs(current, parts, kwargs))
    kwargs.update(_neck_width(parts, kwargs))
    kwargs.update(_backbone_maps(current, parts, kwargs))
    kwargs.update(_prompt_grid(kwargs))
    kwargs.update(_pooled_image_tokens(current, parts, kwargs))
    return kwargs


def _neck_width(parts: Mapping[str, PretrainedConfig], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A segmenter's vision neck as wide as its prompt encoder (SAM's image embeddings, and
    their positional embeddings of num_pos_feats sines and as many cosines, are added to the
    prompt encoder's): output_channels, which other models' necks (GOT-OCR2's) keep for
    their projector, is left alone elsewhere."""
    vision, prompt = kwargs.get("vision_config"), kwargs.get("prompt_encoder_config")
    part = parts.get("vision_config")
    if not isinstance(vision, Mapping) or not isinstance(prompt, Mapping):
        return {}
    if not _is_int(getattr(part, "output_channels", None)) or "hidden_size" not in prompt:
        return {}
    width = prompt["hidden_size"]
    small = {"output_channels": width}
    if _is_int(getattr(part, "num_pos_feats", None)):
        small["num_pos_feats"] = width // 2
    return {"vision_config": {**vision, **small}}


def _backbone_maps(
    current: Mapping[str, Any], parts: Mapping[str, PretrainedConfig], kwargs: Mapping[str, Any]
) -> dict[str, Any]:
    """A SAM 2 vision config's copy of its backbone's stages: the neck's input widths
    (backbone_channel_list, last stage first) and the sizes of the feature maps it reshapes
    them to, which scale with the backbone's grid of patches."""
    backbone, part = kwargs.get("backbone_config"), parts.get("backbone_config")
    if not isinstance(backbone, Mapping) or part is None:
        return {}
    small: dict[str, Any] = {}
    widths = backbone.get("embed_dim_per_stage")
    if isinstance(current.get("backbone_channel_list"), list) and isinstance(widths, list):
        small["backbone_channel_list"] = widths[::-1]
    sizes, full = current.get("backbone_feature_sizes"), _grid(part.to_dict())
    grid = _grid({**part.to_dict(), **backbone})
    if isinstance(sizes, list) and full and grid and grid != full:
        small["backbone_feature_sizes"] = [[n * grid // full for n in size] for size in sizes]
    return small


def _grid(backbone: Mapping[str, Any]) -> int | None:
    """A backbone's patches per image side (its pixels, where it names no patch size)."""
    sizes = [backbone.get("image_size"), backbone.get("patch_size") or 1]
    side, patch = [v[0] if isinstance(v, list | tuple) and v else v for v in sizes]
    if not (isinstance(side, int) and isinstance(patch, int)) or not patch:
        return None
    return side // patch


def _prompt_grid(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A SAM 2 prompt encoder's patch, such that its grid (image_size // patch_size) is the
    vision encoder's smallest feature map, the image embedding its masks are decoded from
    (a Hiera backbone strides 16 pixels there: 4 x 2 x 2, not a patch of the generic size)."""
    vision, prompt = kwargs.get("vision_config"), kwargs.get("prompt_encoder_config")
    if not isinstance(vision, Mapping) or not isinstance(prompt, Mapping):
        return {}
    sizes, image = vision.get("backbone_feature_sizes"), prompt.get("image_size")
    if not isinstance(sizes, list) or not sizes or not _is_int(image):
        return {}
    patch = image // sizes[-1][0]
    if patch == prompt.get("patch_size"):
        return {}
    return {"prompt_encoder_config": {**prompt, "patch_size": patch}}


def _hiera_stages(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A Hiera backbone's (SAM 2's) stages: each twice as wide as the one before, as a stage
    that pools its queries must be (its residual is pooled only where its width changes), its
    patch embedding as wide as the first stage, and its global-attention blocks (numbered
    across all stages) kept in the stages they were in, each the last of two blocks there: a
    stage's first block pools its queries within windows (a global one cannot: transformers
    divides by its window)."""
    blocks, small = current.get("blocks_per_stage"), kwargs.get("blocks_per_stage")
    if not isinstance(blocks, list) or not isinstance(small, list):
        return {}
    widths = [STAGE_WIDTH * 2**i for i in range(len(blocks))]
    ends = list(accumulate(blocks))
    globals_ = current.get("global_attention_blocks") or []
    stages = sorted({next(s for s, end in enumerate(ends) if i < end) for i in globals_})
    small = [2 if s in stages else n for s, n in enumerate(small)]
    small_ends = list(accumulate(small))
    hiera: dict[str, Any] = {
        "hidden_size": widths[0],
        "embed_dim_per_stage": widths,
        "blocks_per_stage": small,
    }
    if "global_attention_blocks" in current:
        hiera["global_attention_blocks"] = [small_ends[s] - 1 for s in stages]
    return hiera


def _pooled_image_tokens(
    current: Mapping[str, Any], parts: Mapping[str, PretrainedConfig], kwargs: dict[str, Any]
) -> dict[str, int]:
    """Image tokens that pool the (now fewer) patches of the vision part as the full config
    pools them (Gemma 3: 64 x 64 patches averaged 4 x 4 into 16 x 16 tokens), at least one:
    a pool wider than the patches has no stride."""
    tokens, vision = current.get("mm_tokens_per_image"), parts.get("vision_config")
    image, patch = getattr(vision, "image_size", None), getattr(vision, "patch_size", None)
    if not (_is_int(tokens) and _is_int(image) and _is_int(patch)) or tokens < 1:
        return {}
    small = kwargs.get("vision_config", {})
    kernel = max(1, image // patch // int(tokens**0.5))
    side = small.get("image_size", image) // small.get("patch_size", patch) // kernel
    return {"mm_tokens_per_image": max(1, side) ** 2} if side**2 != tokens else {}


def _chained_stages(current: Mapping[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Stage widths given as in, mid and out lists (HGNetV2): each stage reads what the one
    before wrote, the first what the stem wrote."""
    outs = current.get("stage_out_channels")
    if not isinstance(outs, list) or not all(_is_int(c) for c in outs):
        return {}
    widths = _stage_list("width", len(outs))
    stem = current.get("stem_channels")
    first = stem[-1] if isinstance(stem, list) and stem else widths[0]
    small: dict[str, Any] = {
        "stage_out_channels": widths,
        "stage_in_channels": [first, *widths[:-1]],
        "stage_mid_channels": [max(8, w // 2) for w in widths],
    }
    if isinstance(current.get("hidden_sizes"), list):
        small["hidden_sizes"] = widths
    if isinstance(current.get("stage_numb_of_layers"), list):
        small["stage_numb_of_layers"] = [2] * len(outs)
    return small


def _stem_width(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, int]:
    """A stem as wide as the first of the (shrunk) per-stage widths where it was (TextNet's
    first width is its stem's output, which its first stage reads)."""
    stem, widths = current.get("stem_out_channels"), current.get("hidden_sizes")
    small = kwargs.get("hidden_sizes")
    if not (_is_int(stem) and isinstance(widths, list) and widths and isinstance(small, list)):
        return {}
    return {"stem_out_channels": small[0]} if widths[0] == stem else {}


def _layout_widths(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, int]:
    """A layout model's box embedding widths, which together fill the hidden size (LayoutLMv3
    adds 4 coordinates and 2 shapes, concatenated, to its tokens): as many widths filling the
    small hidden size."""
    coordinate, shape = current.get("coordinate_size"), current.get("shape_size")
    hidden, small = current.get("hidden_size"), kwargs.get("hidden_size")
    if not all(_is_int(v) for v in (coordinate, shape, hidden, small)):
        return {}
    if 4 * coordinate + 2 * shape != hidden or small % 2:
        return {}
    return {"coordinate_size": small // 6, "shape_size": (small - 4 * (small // 6)) // 2}


def _encoder_inputs(
    current: Mapping[str, Any], parts: Mapping[str, PretrainedConfig], kwargs: dict[str, Any]
) -> dict[str, Any]:
    """A detector's encoder input widths: the widths its (shrunk) backbone's output stages
    now have."""
    small: dict[str, Any] = {}
    decoder_in = current.get("decoder_in_channels")
    if isinstance(decoder_in, list) and "encoder_hidden_dim" in kwargs:  # what the encoder wrote
        small["decoder_in_channels"] = [kwargs["encoder_hidden_dim"]] * len(decoder_in)
    wanted = current.get("encoder_in_channels")
    backbone = kwargs.get("backbone_config")
    if not isinstance(wanted, list) or not isinstance(backbone, Mapping):
        return small
    widths = backbone.get("stage_out_channels") or backbone.get("hidden_sizes")
    part = parts.get("backbone_config")
    indices = backbone.get("out_indices") or getattr(part, "out_indices", None)
    if not isinstance(widths, list) or not indices:
        return small
    channels = [widths[i - 1] for i in indices if 0 < i <= len(widths)]
    return small | ({"encoder_in_channels": channels[-len(wanted) :]} if channels else {})


def _resnet_backbone(timm_part: PretrainedConfig) -> dict[str, Any]:
    """transformers' own small ResNet in place of a timm backbone (timm is not installed),
    with as many output stages."""
    from transformers import ResNetConfig

    stages = list(getattr(timm_part, "out_indices", None) or [4])
    small = shrunk_arguments(ResNetConfig())
    return {"model_type": "resnet", **small, "out_features": [f"stage{i}" for i in stages]}


def _rotary_dim(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, int]:
    """A rotary width that keeps its share of the (now small) head."""
    rotary = current.get("rotary_dim")
    width = next((k for k in ("hidden_size", "n_embd", "d_model") if _is_int(current.get(k))), "")
    count = next((k for k in ("num_attention_heads", "n_head") if _is_int(current.get(k))), "")
    if not (_is_int(rotary) and width and count) or not rotary:
        return {}
    hidden, heads = current[width], current[count]
    small_head = kwargs.get(width, hidden) // kwargs.get(count, heads)
    share = rotary / (hidden // heads)
    return {"rotary_dim": max(2, int(small_head * share) // 2 * 2)}


def _per_layer(current: Mapping[str, Any], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Per-layer lists (layer_types, mlp_layer_types...) cut to the kept layers, keeping one
    layer of each kind (a hybrid keeps its attention and its linear layers: one more layer
    where two are not enough), and layer indices (attn_layer_indices...) kept within them."""
    key = next((k for k in LAYER_KEYS if k in kwargs), None)
    if key is None or not _is_int(current.get(key)):
        return {}
    full = current[key]
    lists = {
        k: kwargs.get(k, v)  # (already shrunk where a size rule applies: one FFN per layer)
        for k, v in current.items()
        if isinstance(v, list) and len(v) == full and k not in STAGE_LISTS and full > 1
    }
    kept = list(range(kwargs[key]))
    for values in lists.values():
        firsts = sorted({str(v): i for i, v in reversed(list(enumerate(values)))}.values())
        if len(firsts) > 1:
            kept = sorted(set(firsts[:4]) | set(range(max(0, kwargs[key] - len(firsts)))))
            break
    small: dict[str, Any] = {k: [v[i] for i in kept] for k, v in lists.items()}
    if set(small.get("layer_types", ["?"])) == {"linear_attention"}:
        # A hybrid whose default has no attention layer at all, which transformers' mask code
        # cannot run: its last layer is made the attention layer its checkpoints have.
        small["layer_types"][-1] = "full_attention"
    if len(kept) != kwargs[key]:
        small[key] = len(kept)
    layers = len(kept)
    for k, v in current.items():
        indices = isinstance(v, list) and v and all(_is_int(i) for i in v)
        if k.endswith(LAYER_INDICES) and indices and max(v) >= layers:
            small[k] = sorted({min(i, layers - 1) for i in v})
    return small


def _backbone_outputs(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """A backbone's output stages within its fewer layers: as many outputs as before (a
    neck reads one per stage), with as many layers as that takes."""
    indices = current.get("out_indices")
    layers = kwargs.get("num_hidden_layers")
    if not isinstance(indices, list | tuple) or not _is_int(layers):
        return {}
    if all(_is_int(i) and i <= layers for i in indices):
        return {}
    layers = max(layers, len(indices))
    kept = list(range(1, layers + 1))[-len(indices) :]
    return {"out_indices": kept, "out_features": None, "num_hidden_layers": layers}


def _pixel_window(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, int]:
    """A window measured in pixels (Qwen2.5-VL's: 112 = 8 patches of 14) rather than in
    patches: as many of the small patches. (A window in patches is a few patches wide: Swin's
    7, or 8 of 4 pixels.)"""
    window, patch = current.get("window_size"), current.get("patch_size")
    if not (_is_int(window) and _is_int(patch)) or patch < 2 or window < 4 * patch:
        return {}
    if window % patch:
        return {}
    return {"window_size": kwargs.get("patch_size", patch) * (window // patch)}


def _stage_windows(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, int]:
    """A hierarchy of windowed stages (Swin), each half the last one's resolution: windows of
    2 x 2 patches and an image big enough that the last stage still fills one, as 224-pixel
    images fill Swin's 7 x 7 windows at its last stage. (A stage smaller than its window
    shrinks the window but not its relative position table.)"""
    depths, window = current.get("depths"), current.get("window_size")
    patch = kwargs.get("patch_size", current.get("patch_size"))
    image = current.get("image_size")
    if not (isinstance(depths, list) and depths and _is_int(window) and _is_int(patch)):
        return {}
    if not _is_int(image):
        return {}
    return {"window_size": 2, "image_size": patch * 2 ** (len(depths) - 1) * 2}


def _depthwise_groups(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, int]:
    """Convolution groups as many as the channels (a depthwise convolution: Mimi's upsampling,
    512 groups of a 512-wide model) stay as many as the now fewer channels."""
    hidden = current.get("hidden_size")
    if not _is_int(hidden) or "hidden_size" not in kwargs:
        return {}
    return {
        name: kwargs["hidden_size"]
        for name, value in current.items()
        if name.endswith("_groups") and _is_int(value) and value == hidden
    }


def _codec_widths(current: Mapping[str, Any]) -> dict[str, int]:
    """An audio codec's first convolution width, which doubles at each down-sampling stage:
    small enough that the last stage is CODEC_WIDTH wide."""
    ratios = current.get("downsampling_ratios") or current.get("upsampling_ratios")
    if not isinstance(ratios, list | tuple) or not ratios:
        return {}
    base = max(1, CODEC_WIDTH // 2 ** len(ratios))
    return {
        name: base
        for name in ("num_filters", "encoder_hidden_size")
        if _is_int(current.get(name)) and current[name] > base
    }


def _feature_layers(current: Mapping[str, Any]) -> dict[str, Any]:
    """The vision layers a multimodal model reads features from (counted from the first),
    kept within the small vision encoder's layers."""
    layers = current.get("vision_feature_layer")
    if not isinstance(layers, list) or not all(_is_int(i) and i >= LAYERS for i in layers):
        return {}
    return {"vision_feature_layer": [LAYERS - 1 - i for i in range(len(layers))]}


def _kv_heads(current: Mapping[str, Any]) -> dict[str, int]:
    """Key/value heads as the full config has them: as many as the query heads, one (multi-
    query), or a group of them (grouped-query). (A config may name its query heads num_heads,
    as EXAONE 4.5's vision config does.)"""
    kv = current.get("num_key_value_heads")
    heads = current.get("num_attention_heads", current.get("num_heads"))
    if kv is None and "num_key_value_heads" in current and _is_int(heads):
        return {"num_key_value_heads": HEADS}  # (left None by a config that never derives it)
    if not _is_int(kv) or not _is_int(heads):
        return {}
    return {"num_key_value_heads": HEADS if kv == heads else 1 if kv == 1 else KV_HEADS}


def _kv_heads_per_layer(current: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Key/value heads given per layer (Sapiens2's: full attention in its first and last layers,
    grouped-query between), each as _kv_heads keeps one: as many as the (fewer) query heads,
    one, or a group."""
    heads = current.get("num_attention_heads")
    small: dict[str, Any] = {}
    for name, value in kwargs.items():
        per_layer = isinstance(value, list) and value and all(_is_int(v) for v in value)
        if "key_value_heads" not in name or not per_layer or not _is_int(heads):
            continue
        small[name] = [HEADS if v == heads else 1 if v == 1 else KV_HEADS for v in value]
    return small


def _customised(part: PretrainedConfig) -> dict[str, Any]:
    """What a composite config set differently in its part from the part class's defaults,
    except values the part derives from its sizes."""
    defaults = type(part)().to_dict()
    return {
        k: _kinds_once(v, defaults[k])
        for k, v in part.to_dict().items()
        if k not in DERIVED and k in defaults and defaults[k] != v
    }


def _kinds_once(value: Any, default: Any) -> Any:
    """A composite's own list of layer kinds for its part (Nemo Speech LM's 40 hybrid text
    layers, where its part's class counts its layers by that list), longer than the part's
    default: each kind once, in order of first use; any other value as it is."""
    kinds = isinstance(value, list) and value and all(isinstance(v, str) for v in value)
    if not kinds or not isinstance(default, list) or len(value) <= max(len(default), LAYERS):
        return value
    return list(dict.fromkeys(value))


def _merged(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """base with extra's values, dicts (a part's arguments) merged key by key."""
    merged = dict(base)
    for k, v in extra.items():
        both = isinstance(v, Mapping) and isinstance(merged.get(k), Mapping)
        merged[k] = _merged(merged[k], v) if both else v
    return merged


def _override(config_class: type[PretrainedConfig], model_type: str) -> tuple[dict, str]:
    """The override of the config class's own type, else the target's: a composite type's
    causal LM (Qwen4-Exp's) takes its text config alone, whose override is not the
    composite's."""
    own = getattr(config_class, "model_type", None)
    return OVERRIDES.get(own) or OVERRIDES.get(model_type, ({}, ""))  # type: ignore[arg-type]


def shrink(
    config_class: type[PretrainedConfig], model_type: str, extra: Mapping[str, Any] | None = None
) -> PretrainedConfig:
    """A small config of the class: the generic rules, the type's override (if any), then
    extra (what a trial forward asked for). Where the class's default config fails its own
    checks, the default with the override is shrunk."""
    override, _reason = _override(config_class, model_type)
    try:
        default = config_class()
    except Exception:  # (strict config validation errors are not ValueErrors)
        if not override:
            raise
        default = config_class(**override)
    kwargs = shrunk_arguments(default)
    return config_class(**_merged(_merged(kwargs, override), extra or {}))


SPLIT = re.compile(r"split_sizes to sum exactly to (\d+).*split_sizes=\[([\d, ]+)\]")


SECTIONS_SAID = re.compile(r"mrope_section.*got \[([\d, ]+)\] for `?\w+`?=(\d+)", re.DOTALL)


def mrope_sections(error: Exception) -> list[int] | None:
    """The sections a multimodal rotary embedding must have, from the error of a model whose
    sections (its full-size default) do not add up to its small head: the default's
    proportions, summing to what the head has."""
    found, said = SPLIT.search(str(error)), SECTIONS_SAID.search(str(error))
    if found is not None:
        total, sections = int(found.group(1)), [int(x) for x in found.group(2).split(",")]
    elif said is not None:  # a config's own check: "... got [24, 20, 20] for head_dim=16"
        total, sections = int(said.group(2)) // 2, [int(x) for x in said.group(1).split(",")]
    else:
        return None
    scaled = [max(1, round(x * total / sum(sections))) for x in sections]
    scaled[-1] += total - sum(scaled)
    return scaled if scaled[-1] > 0 else None


def with_rope_sections(config: PretrainedConfig, sections: list[int]) -> dict[str, Any]:
    """Arguments giving the config, and each part with a rotary embedding, these sections: a
    part's own parts too (ColQwen2's language model, in the text config of its VLM's config)."""
    extra: dict[str, Any] = {}
    rope = getattr(config, "rope_parameters", None)
    if isinstance(rope, Mapping):
        extra["rope_parameters"] = {**rope, "mrope_section": sections}
    for name, part in parts_of(config).items():
        if nested := with_rope_sections(part, sections):
            extra[name] = nested
    return extra
