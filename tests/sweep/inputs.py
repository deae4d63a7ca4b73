"""Inputs that fit a model and its head, made from its forward's parameters and its config.

Text gets token ids below the small vocabulary's special tokens, images get pixels of the
config's size and channels, audio a waveform or log-mel features of the length the config
implies; labels are made for the head (next tokens, masked tokens, classes, CTC characters,
answer spans). A multimodal LM gets images and its text (build() in worker.py fits the
number of image tokens to the features), or its text alone where images cannot be fitted.
Everything comes from one seeded CPU generator.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import torch
from shrink import parts_of
from transformers import PretrainedConfig

SEQ = 16
DECODER_SEQ = 8
BATCH = 2
REGIONS = 8  # detected image regions (LXMERT's visual features)
MAX_SIDE = 256  # (images grown for a network that leaves them nothing at its last stage)
HIDDEN = 64  # (a width the config does not name: the shrinker's hidden size)
WAVEFORM = 1600
CTC_LABELS = 6
SEED = 5678
SPECIAL = 32  # ids at the top of the vocabulary are left to special tokens (shrink.py)
LOW = 3  # and ids below this (pad, bos, eos in most vocabularies)
GRID = 2  # patches per side of a flattened-patch image (after the spatial merge)
MULTIMODAL = ("image_text_to_text", "multimodal_lm")  # text with images in it
FEATURE_MASKS = {"input_features_mask", "feature_attention_mask", "input_features_attention_mask"}
VISION_TOWERS = ("vision_tower", "vision_model", "vision_encoder")
EMBEDS = ("inputs_embeds", "query_embeds", "hidden_states", "input_embeds")


class InputError(Exception):
    """The generator cannot make an input the model requires."""


def _find(config: PretrainedConfig, *names: str) -> Any:
    """The first of names set on the config or on one of its parts (text_config...), nearest
    first: a part's own parts too (a speech LM's audio encoder nested in its audio config)."""
    level = [config]
    while level:
        for part in level:
            for name in names:
                value = getattr(part, name, None)
                if value is not None:
                    return value
        level = [v for part in level for v in parts_of(part).values()]
    return None


def _side(value: Any) -> int:
    """An image size given as an int, a list/tuple, or a {"height", "width"} dict."""
    if isinstance(value, dict):
        return int(value.get("height", value.get("shortest_edge", 32)))
    if isinstance(value, list | tuple):
        return int(value[0])
    return int(value)


def _ids(g: torch.Generator, vocab: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Token ids that are neither low special ids nor the moved ones at the top."""
    high = vocab - SPECIAL if vocab > 4 * SPECIAL else vocab
    low = LOW if high > 2 * LOW else 0
    return torch.randint(low, high, shape, generator=g)


def _labels(head: str, ids: torch.Tensor | None, classes: int, g: torch.Generator) -> dict:
    """The labels of the head, or none (the base model's loss is made from its outputs)."""
    if head in ("causal_lm", "image_text_to_text", "multimodal_lm") and ids is not None:
        return {"labels": ids.clone()}
    if head == "masked_lm" and ids is not None:
        keep = torch.rand(ids.shape, generator=g) < 0.3
        keep[:, 3] = True
        return {"labels": ids.masked_fill(~keep, -100)}
    if head in ("image_classification", "audio_classification", "sequence_classification"):
        return {"labels": torch.randint(0, classes, (BATCH,), generator=g)}
    if head == "token_classification":
        return {"labels": torch.randint(0, classes, (BATCH, SEQ), generator=g)}
    if head == "question_answering":
        return {
            "start_positions": torch.randint(0, SEQ, (BATCH,), generator=g),
            "end_positions": torch.randint(0, SEQ, (BATCH,), generator=g),
        }
    return {}


def make_batch(
    model: torch.nn.Module,
    head: str,
    config: PretrainedConfig,
    text_only: bool = False,
    images: bool = False,
) -> dict[str, Any]:
    """The keyword arguments of one training step of the model (a multimodal LM's text
    alone, with text_only; images with the text of any head that reads them, with images)."""
    if type(model).forward is torch.nn.Module.forward:
        # (Bark, the Qwen Omni composites, GLM-Image's VQ model: generate() or encode() only)
        raise InputError(f"{type(model).__name__} has no forward: no training step to run")
    g = torch.Generator().manual_seed(SEED)
    params = inspect.signature(model.forward).parameters
    vocab = int(_find(config, "vocab_size") or 1024)
    batch: dict[str, Any] = {}
    ids = None
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    seq2seq = head in ("seq2seq_lm", "speech_seq2seq") or (head in MULTIMODAL and encoder_decoder)
    audio_in = "input_values" in params or "input_features" in params
    multimodal = head in MULTIMODAL
    image_in = "pixel_values" in params and not (multimodal and text_only) and _sees(config)
    # (a decoder-only speech LM reads its prompt and transcript as text after the audio)
    text_in = not (audio_in and (head == "ctc" or (head == "speech_seq2seq" and encoder_decoder)))
    # (an image classifier reads no text, but a VLM's does: its prompt around its image tokens)
    prompted = _is_id(_modality_token(config))
    if (
        "input_ids" in params
        and text_in
        and not (image_in and head == "image_classification" and not prompted)
    ):
        ids = _ids(g, vocab, (BATCH, SEQ))
        batch["input_ids"] = ids
        if "attention_mask" in params:
            batch["attention_mask"] = torch.ones(BATCH, SEQ, dtype=torch.long)
    shown = ids is None or head in ("model", "image_classification") or multimodal or images
    if "pixel_values" in params and ((image_in and shown) or _required(params, "pixel_values")):
        channels = int(_find(config, "num_channels", "in_channels") or 3)
        side = _side(_find(config, "image_size", "img_size") or 32)
        frames = _find(config, "num_frames")
        shape = (
            (BATCH, int(frames), channels, side, side) if frames else (BATCH, channels, side, side)
        )
        batch["pixel_values"] = torch.randn(shape, generator=g)  # (a video: frames first)
        patch = _find(config, "patch_size")
        for name in ("target_sizes", "tgt_sizes") if isinstance(patch, int) else ():
            if name in params:  # each image's grid of patches (height, width)
                batch[name] = torch.tensor([[side // patch] * 2] * BATCH)
                batch["pixel_values"] = _packed(batch["pixel_values"], patch)
        if "spatial_shapes" not in params and _features_need(model, "pixel_attention_mask"):
            # (images cut into tiles, padded to as many per item: Granite Docling's; one each)
            batch["pixel_values"] = batch["pixel_values"].unsqueeze(1)
            batch["pixel_attention_mask"] = torch.ones(BATCH, 1, dtype=torch.bool)
        if "image_sizes" in params and not frames and _reads_image_sizes(model, config):
            batch["image_sizes"] = torch.tensor([[side, side]] * BATCH)  # (pixels)
    if "image_token_pooling" in params and "pixel_values" in batch and ids is not None:
        batch.update(_pooled_crops(config, g))
    if "image_encoder_embeddings" in params and "pixel_values" in batch and ids is not None:
        # (IDEFICS: each token cross-attends to the images its (text, images) mask lets it see)
        batch["pixel_values"] = batch["pixel_values"].unsqueeze(1)  # one image each
        batch["image_attention_mask"] = torch.ones(BATCH, SEQ, 1, dtype=torch.long)
    if "prompt_pixel_values" in params and "prompt_masks" in params and "pixel_values" in batch:
        batch.update(_prompted_images(config, g))
    if "image_embeds_position_mask" in params and "pixel_values" in batch and ids is not None:
        batch["image_embeds_position_mask"] = _image_positions(config)
    frames, bins = _find(config, "max_length"), _find(config, "num_mel_bins")
    alone = ids is None and "pixel_values" not in batch  # audio is what the model reads
    if "input_values" in params and (alone or _required(params, "input_values")):
        if frames and bins:  # a spectrogram (AST)
            batch["input_values"] = torch.randn(BATCH, int(frames), int(bins), generator=g)
        elif channels := _find(config, "audio_channels"):  # a codec: (batch, channels, samples)
            batch["input_values"] = torch.randn(BATCH, int(channels), WAVEFORM, generator=g)
        else:
            batch["input_values"] = torch.randn(BATCH, WAVEFORM, generator=g)
    if "padding_mask" in params and head == "ctc" and "input_values" in batch:
        # (a CTC loss over the frames the mask of real samples leaves: OmniASR's)
        batch["padding_mask"] = torch.ones(batch["input_values"].shape, dtype=torch.long)
    if "input_features" in params and (
        (alone and "input_values" not in batch)
        or _required(params, "input_features")
        or (seq2seq and "pixel_values" not in batch)
        or "return_loss" in params  # (a contrastive model: audio paired with its text)
    ):
        bins = int(_find(config, "num_mel_bins", "feature_size", "input_feat_per_channel") or 16)
        positions = _find(config, "max_source_positions")
        frames = 2 * int(positions) if positions else 64
        per_token = _find(config, "audio_length_per_tok")
        if per_token and ids is not None:  # a streaming model: each token adds its frames' audio
            frames = ids.shape[1] * int(per_token)
        batch["input_features"] = torch.randn(BATCH, bins, frames, generator=g)
        for mask in _feature_masks(batch, params):  # every frame is speech
            batch[mask] = torch.ones(BATCH, frames, dtype=torch.long)
    if "pixel_position_ids" in params and "pixel_values" in batch:
        batch.update(_positioned_patches(config, g))
    if "flattened_patches" in params and not batch:
        batch.update(_numbered_patches(config, g))
    if "audio_mel" in params and "audio_mel_mask" in params and not batch:
        # (Gemma 3n's audio encoder: time-major log-mels, and a mask true where they are padding)
        bins = int(_find(config, "input_feat_size", "num_mel_bins") or 16)
        batch["audio_mel"] = torch.randn(BATCH, SEQ * 4, bins, generator=g)
        batch["audio_mel_mask"] = torch.zeros(BATCH, SEQ * 4, dtype=torch.bool)
    if "duration_labels" in params and ids is not None:
        batch.update(_speech_targets(config, g))
    if "bbox" in params and ids is not None:  # layout models: a box per token
        corner = torch.randint(0, 500, (BATCH, SEQ, 2), generator=g)
        size = torch.randint(1, 500, (BATCH, SEQ, 2), generator=g)
        batch["bbox"] = torch.cat([corner, corner + size], dim=-1)
    if "past_values" in params:
        batch.update(_series(config, params, g))
    if "states" in params and "actions" in params:
        batch.update(_trajectory(config, g))
    for name in params:  # a second text input (a Q-Former's prompt...): ids every vocabulary has
        if name.endswith("_input_ids") and _required(params, name):
            batch[name] = torch.randint(LOW, 100, (BATCH, SEQ), generator=g)
            mask = name.replace("input_ids", "attention_mask")
            if mask in params:
                batch[mask] = torch.ones(BATCH, SEQ, dtype=torch.long)
    if "task_inputs" in params and "pixel_values" in batch:  # (OneFormer: its task's prompt)
        length = int(_find(config, "task_seq_len") or SEQ)
        batch["task_inputs"] = _ids(g, vocab, (BATCH, length))
    if "classes_structure" in params and "classes_input_ids" in batch:  # each image's classes
        per_item = len(batch["classes_input_ids"]) // BATCH  # (OmDet-Turbo's prompts, in rows)
        batch["classes_structure"] = torch.full((BATCH,), per_item, dtype=torch.long)
    if {"marks", "num_options", "question_type_ids"} <= set(params):
        batch = _decision(vocab, g)
    if "visual_feats" in params and "visual_pos" in params:  # detected regions (LXMERT)
        width = int(_find(config, "visual_feat_dim") or HIDDEN)
        batch["visual_feats"] = torch.randn(BATCH, REGIONS, width, generator=g)
        batch["visual_pos"] = torch.rand(BATCH, REGIONS, int(_find(config, "visual_pos_dim") or 4))
    if {"grid_thw", "image_grid_thw"} & set(params) or _features_need(model, "image_grid_hw"):
        batch.update(_patches(config, g, params))
        if _generates_images(model) and "image_grid_thw" in batch:  # (a target grid too)
            batch["image_grid_thw"] = batch["image_grid_thw"].repeat(2, 1)
    if "pixel_values_videos" in params and (not batch or _required(params, "pixel_values_videos")):
        batch["pixel_values_videos"] = _video(config, g)
    if "spatial_shapes" in params and "pixel_attention_mask" in params:
        batch.update(_flat_patches(config, g))
    if "latents" in params and not batch:  # a codec's decoder: (batch, latent width, frames)
        width = int(_find(config, "latent_dim", "hidden_size") or HIDDEN)
        batch["latents"] = torch.randn(BATCH, width, SEQ // 2, generator=g)
    if "actions" in params and "states" not in params:  # a robot policy: the actions to learn
        chunk, act = _find(config, "chunk_size"), _find(config, "max_action_dim")
        batch["actions"] = torch.randn(BATCH, int(chunk or 4), int(act or 8), generator=g)
        if "state" in params:
            state = int(_find(config, "max_state_dim") or 8)
            batch["state"] = torch.randn(BATCH, state, generator=g)
        if "noise" in params and "timestep" in params:  # a flow-matching policy's draws, given
            # (else drawn on the device from its generator, where the CPU draws from its own)
            batch["noise"] = torch.randn(batch["actions"].shape, generator=g)
            batch["timestep"] = torch.rand(BATCH, generator=g)
        if "pixel_attention_mask" in params and "pixel_values" in batch:  # one camera each
            batch["pixel_values"] = batch["pixel_values"].unsqueeze(1)
            batch["pixel_attention_mask"] = torch.ones(BATCH, 1, dtype=torch.bool)
    if "shared_kv_states" in params and "inputs_embeds" in params:
        batch = _drafter(config, g)
    if "noise_embeds" in params and "context_hidden_states" in params and not batch:
        batch = _block_drafter(config, g)
    if not batch:
        hidden = _find(config, "hidden_size", "d_model")
        embeds = next((n for n in EMBEDS if n in params), None)
        if embeds and hidden:
            batch[embeds] = torch.randn(BATCH, SEQ, int(hidden), generator=g)
    width = _find(config, "encoder_hidden_size")
    if "encoder_hidden_states" in params and width and batch:  # what cross-attention attends to
        batch["encoder_hidden_states"] = torch.randn(BATCH, SEQ, int(width), generator=g)
    if not batch:
        raise InputError(f"no input the generator knows among {', '.join(list(params)[:8])}")
    if seq2seq and not getattr(config, "is_encoder_decoder", True) and ids is not None:
        batch["labels"] = ids.clone()  # a decoder-only LM listed as sequence-to-sequence
    elif seq2seq:
        batch["labels"] = _ids(g, vocab, (BATCH, DECODER_SEQ))
        if "decoder_input_ids" in params:  # the labels shifted right, as generation starts
            start = int(_find(config, "decoder_start_token_id", "pad_token_id") or 0)
            shifted = batch["labels"].roll(1, dims=1)
            batch["decoder_input_ids"] = shifted.index_fill(1, torch.tensor([0]), start)
    elif head == "ctc":
        batch["labels"] = torch.randint(LOW, min(vocab, 32), (BATCH, CTC_LABELS), generator=g)
    else:
        classes = int(getattr(config, "num_labels", 2) or 2)
        batch.update(_labels(head, ids, classes, g))
        if getattr(config, "is_encoder_decoder", False) and "decoder_input_ids" in params:
            batch["decoder_input_ids"] = _ids(g, vocab, (BATCH, DECODER_SEQ))
    missing = [n for n in params if _required(params, n) and n not in batch]
    if missing:
        raise InputError(f"required input(s) the generator cannot make: {', '.join(missing)}")
    return batch


def _series(config: PretrainedConfig, params: Any, g: torch.Generator) -> dict[str, Any]:
    """A time series: past values (with the lags the model reads before its context), their
    observed mask and time features, and the future values a training step predicts."""
    horizon = int(getattr(config, "prediction_length", None) or 4)
    context = int(getattr(config, "context_length", None) or horizon)
    lags = getattr(config, "lags_sequence", None) or [0]
    length = context + max(lags)
    channels = getattr(config, "num_input_channels", None)
    shape: tuple[int, ...] = (BATCH, length, int(channels)) if channels else (BATCH, length)
    future: tuple[int, ...] = (BATCH, horizon, int(channels)) if channels else (BATCH, horizon)
    features = int(getattr(config, "num_time_features", 0) or 0)
    series: dict[str, Any] = {"past_values": torch.randn(shape, generator=g)}
    extras = {
        "past_observed_mask": torch.ones(shape),
        "observed_mask": torch.ones(shape),
        "past_time_features": torch.randn(BATCH, length, features, generator=g),
        "future_values": torch.randn(future, generator=g),
        "future_time_features": torch.randn(BATCH, horizon, features, generator=g),
        "past_values_padding": torch.zeros(shape),
        "freq": torch.zeros(BATCH, 1, dtype=torch.long),
    }
    series.update({k: v for k, v in extras.items() if k in params})
    return series


def _speech_targets(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """A text-to-speech model's targets (FastSpeech 2, which trains only on all of them): each
    token's duration in frames (two each), its pitch and energy, and the log-mel spectrogram
    those frames make."""
    frames, bins = 2 * SEQ, int(_find(config, "num_mel_bins") or 80)
    return {
        "duration_labels": torch.full((BATCH, SEQ), 2, dtype=torch.long),
        "pitch_labels": torch.randn(BATCH, SEQ, 1, generator=g),
        "energy_labels": torch.randn(BATCH, SEQ, 1, generator=g),
        "spectrogram_labels": torch.randn(BATCH, frames, bins, generator=g),
    }


def _drafter(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """A multi-token-prediction drafter's inputs (Gemma 4's assistant): the backbone's
    embedding and hidden state, concatenated, and the keys and values of the backbone's last
    layer of each attention kind, which it attends to instead of its own keys and values (it
    ignores token ids)."""
    text = config.get_text_config()
    width = 2 * int(_find(config, "backbone_hidden_size") or HIDDEN)
    states = {}
    for i, kind in enumerate(text.layer_types):
        layer = text.per_layer_config[i]
        shape = (BATCH, layer.num_key_value_heads, SEQ, layer.head_dim)
        states[kind] = (torch.randn(shape, generator=g), torch.randn(shape, generator=g))
    return {
        "inputs_embeds": torch.randn(BATCH, SEQ, width, generator=g),
        "shared_kv_states": states,
    }


def _block_drafter(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """A block-diffusion drafter's inputs (Muse Glimmer's assistant, DFlash): the embeddings of
    a block of masked tokens it denoises, and the hidden states of the backbone's target layers,
    concatenated, at the tokens accepted before it."""
    width = int(_find(config, "hidden_size") or HIDDEN)
    block = int(_find(config, "block_size") or SEQ)
    layers = len(_find(config, "target_layer_ids") or [0])
    return {
        "noise_embeds": torch.randn(BATCH, block, width, generator=g),
        "context_hidden_states": torch.randn(BATCH, SEQ // 2, width * layers, generator=g),
    }


def _decision(vocab: int, g: torch.Generator) -> dict[str, Any]:
    """A decision head's prompt (JEV's): one text (its forward reads one) with a question of
    each type (no/yes, choice, score), each closed by a mark token, whose previous token's state
    scores the question's options, and the option each question's answer is."""
    return {
        "input_ids": _ids(g, vocab, (1, SEQ)),
        "marks": torch.tensor([[5, 10, 15]]),  # (1-based: the states at tokens 4, 9 and 14)
        "num_options": torch.tensor([[2, 3, 3]]),
        "question_type_ids": torch.tensor([[0, 1, 2]]),
        "labels": torch.tensor([[1, 0, 2]]),
    }


def _trajectory(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """An offline RL trajectory (Decision Transformer): states, actions, rewards, returns to
    go and time steps."""
    state, act = int(getattr(config, "state_dim", 4)), int(getattr(config, "act_dim", 2))
    return {
        "states": torch.randn(BATCH, SEQ, state, generator=g),
        "actions": torch.randn(BATCH, SEQ, act, generator=g),
        "rewards": torch.randn(BATCH, SEQ, 1, generator=g),
        "returns_to_go": torch.randn(BATCH, SEQ, 1, generator=g),
        "timesteps": torch.arange(SEQ).repeat(BATCH, 1),
        "attention_mask": torch.ones(BATCH, SEQ, dtype=torch.long),
    }


def _patches(config: PretrainedConfig, g: torch.Generator, params: Any) -> dict[str, Any]:
    """Flattened patches and their (t, h, w) grid, as Qwen2-VL-style vision encoders take
    them (or their (h, w) grid, Nemotron-H Omni's): one image of GRID x GRID patches."""
    patch = int(_find(config, "patch_size") or 14)
    temporal = int(_find(config, "temporal_patch_size", "patch_temporal") or 1)
    channels = int(_find(config, "in_channels", "num_channels", "in_chans") or 3)
    merge = int(_find(config, "spatial_merge_size") or 1)
    side = GRID * merge
    grid_name = next(n for n in ("grid_thw", "image_grid_thw", "image_grid_hw") if n in params)
    grid = [1, side, side] if grid_name.endswith("thw") else [side, side]  # (images alone: h, w)
    pixels = "hidden_states" if "hidden_states" in params else "pixel_values"
    found = {
        pixels: torch.randn(side * side, channels * temporal * patch * patch, generator=g),
        grid_name: torch.tensor([grid]),
    }
    sizes = "merge_sizes" if "merge_sizes" in params else "image_merge_sizes"
    if sizes in params:  # each image's merge (VideoLLaMA 3's: images and videos merge apart)
        found[sizes] = torch.tensor([merge])
    return found


def _pooled_crops(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """An image as Molmo 2's processor gives it: one crop of flattened patches, and its tokens
    at low and high resolution (a 2 x 2 grid of each), each pooling a 2 x 2 block of patches,
    its patches' indices in image_token_pooling."""
    side = _side(_find(config, "image_size") or 32)
    patch = int(_find(config, "patch_size") or 14)
    grid = side // patch
    ids = torch.arange(grid * grid).view(grid // 2, 2, grid // 2, 2).transpose(1, 2)
    blocks = ids.reshape(-1, 4)  # (tokens, the 4 patches each pools)
    return {
        "pixel_values": torch.randn(1, grid * grid, 3 * patch * patch, generator=g),
        "image_grids": torch.tensor([[grid // 2, grid // 2] * 2]),
        "image_token_pooling": torch.cat([blocks, blocks]),
        "image_num_crops": torch.tensor([1]),
    }


def _prompted_images(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """An image, a prompt image and the prompt's mask (SegGPT's in-context segmentation), each
    half the config's image: the model stacks the prompt above the input."""
    height, width = (int(x) for x in _find(config, "image_size"))
    channels = int(_find(config, "num_channels") or 3)
    shape = (BATCH, channels, height // 2, width)
    return {
        "pixel_values": torch.randn(shape, generator=g),
        "prompt_pixel_values": torch.randn(shape, generator=g),
        "prompt_masks": torch.randn(shape, generator=g),
    }


def _positioned_patches(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """An image as rows of flattened patches with each patch's (x, y) (Gemma 4's vision
    encoder): a square of 2 x 2 pooling kernels of patches, which it pools to 4 tokens."""
    patch = int(_find(config, "patch_size") or 16)
    kernel = int(_find(config, "pooling_kernel_size") or 1)
    side = 2 * kernel
    y, x = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    positions = torch.stack([x.flatten(), y.flatten()], dim=-1)
    return {
        "pixel_values": torch.randn(BATCH, side * side, 3 * patch * patch, generator=g),
        "pixel_position_ids": positions.expand(BATCH, -1, -1).contiguous(),
    }


def _numbered_patches(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """An image as Pix2Struct's processor gives it: rows of flattened patches, each led by its
    row and column (from 1: 0 is padding), 2 GRID x 2 GRID of them, and their mask."""
    width = int(_find(config, "patch_embed_hidden_size") or 3 * 16 * 16)
    numbers = torch.arange(1, 2 * GRID + 1)  # (2 x 2 merged patches a side: as the others')
    rows, cols = torch.meshgrid(numbers, numbers, indexing="ij")
    place = torch.stack([rows.flatten(), cols.flatten()], dim=-1).float().expand(BATCH, -1, -1)
    pixels = torch.randn(BATCH, len(place[0]), width, generator=g)
    return {
        "flattened_patches": torch.cat([place, pixels], dim=-1),
        "attention_mask": torch.ones(BATCH, len(place[0]), dtype=torch.long),
    }


def _packed(pixels: torch.Tensor, patch: int) -> torch.Tensor:
    """Images NaViT-packed as MiniCPM-V's processor packs them for a model that reads each
    image's grid of patches: one row of every image's patches, (1, channels, patch, patches x
    patch), which its patch convolution embeds as one sequence."""
    batch, channels = pixels.shape[:2]
    rows = torch.nn.functional.unfold(pixels, patch, stride=patch)  # (batch, c * p * p, patches)
    rows = rows.view(batch, channels, patch, patch, -1).permute(1, 2, 0, 4, 3)
    return rows.reshape(1, channels, patch, -1)


def _reads_image_sizes(model: torch.nn.Module, config: PretrainedConfig) -> bool:
    """Whether the model reads each image's size: its vision encoder does (Pixtral's), it
    tiles images of any resolution (LLaVA-NeXT's anyres), or its image features require it."""
    if _find(config, "image_grid_pinpoints"):
        return True
    if _features_need(model, "image_sizes"):
        return True  # (a tokenizer of each image at its own size: Apertus 1.5's)
    towers = (m for name, m in model.named_modules() if name.endswith(VISION_TOWERS))
    return any("image_sizes" in inspect.signature(m.forward).parameters for m in towers)


def _image_positions(config: PretrainedConfig) -> torch.Tensor:
    """Where each item's image tokens are in its text, (batch, length), after its first token:
    as many as the model's resampler makes (Kosmos-2 writes its image's latent queries there)."""
    count = int(_find(config, "latent_query_num") or 1)
    mask = torch.zeros(BATCH, SEQ, dtype=torch.long)
    mask[:, 1 : 1 + count] = 1
    return mask


def _sees(config: PretrainedConfig) -> bool:
    """Whether the model has its vision part: not where its vision config is optional and
    unset (EmbeddingGemma 2's default: text alone, its image path refuses images)."""
    return not ("vision_config" in vars(config) and config.vision_config is None)


def _generates_images(model: torch.nn.Module) -> bool:
    """Whether the model generates an image from its images (GLM-Image): its grids are its
    source images' and, last, its target's, which has no pixels."""
    return any(
        callable(getattr(m, "get_image_grids_for_generation", None)) for m in model.modules()
    )


def _features_need(model: torch.nn.Module, name: str) -> bool:
    """Whether the model's image features require the input name, which its forward leaves
    optional (a mask of each image's real tiles, Granite Docling's; the patch grid of each
    image, Nemotron-H Omni's)."""
    return any(_required(_image_features_params(m), name) for m in model.modules())


def _image_features_params(module: torch.nn.Module) -> Any:
    """The parameters of the module's get_image_features (none where it has none): a model
    may need what its forward leaves optional."""
    method = getattr(type(module), "get_image_features", None)
    return inspect.signature(method).parameters if callable(method) else {}


def _video(config: PretrainedConfig, g: torch.Generator) -> torch.Tensor:
    """A batch of videos: (batch, frames, channels, height, width)."""
    channels = int(_find(config, "num_channels", "in_channels") or 3)
    side = _side(_find(config, "image_size", "img_size") or 32)
    frames = int(_find(config, "num_frames") or 4)
    return torch.randn(BATCH, frames, channels, side, side, generator=g)


def _flat_patches(config: PretrainedConfig, g: torch.Generator) -> dict[str, Any]:
    """Images as rows of flattened patches with each image's grid and a mask of real patches
    (NaFlex: SigLIP 2's variable resolution), every patch real."""
    patch = int(_find(config, "patch_size") or 16)
    channels = int(_find(config, "num_channels") or 3)
    side = int(_find(config, "num_patches") or 16) ** 0.5
    grid = max(2, int(side) // 2)
    return {
        "pixel_values": torch.randn(BATCH, grid * grid, channels * patch * patch, generator=g),
        "pixel_attention_mask": torch.ones(BATCH, grid * grid, dtype=torch.long),
        "spatial_shapes": torch.tensor([[grid, grid]] * BATCH),
    }


def _required(params: Any, name: str) -> bool:
    """A forward parameter without a default (not *args/**kwargs)."""
    p = params.get(name)
    return (
        p is not None
        and p.default is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    )


MISMATCH = re.compile(r"tokens do not match\D*?(\d+)\D+?(\d+)", re.IGNORECASE)
FEATURES_FOR = re.compile(r"Got (\d+) feature vectors for (\d+) placeholder tokens")  # (Nemotron's)
# (GLM-Image's: "placeholder tokens (0) does not match number of image tokens from VQVAE (4)")
PLACEHOLDERS = re.compile(
    r"placeholder tokens \((\d+)\) does not match number of \w+ tokens[^(]*\((\d+)\)"
)
# Features scattered into a text that has no placeholder for them (Qwen2-Audio's legacy merge)
NO_PLACEHOLDER = re.compile(r"cannot be broadcast to indexing result of shape \[0\]")
TOKEN_IDS = ("image_token_id", "image_token_index", "audio_token_id", "audio_token_index")
VIDEO_TOKEN_IDS = ("video_token_id", "video_token_index")


def _modality_token(config: PretrainedConfig) -> Any:
    """The config's image (audio) placeholder token id, else its video token id (a model of
    videos alone: InstructBLIP-Video's)."""
    token = _find(config, *TOKEN_IDS)
    return token if token is not None else _find(config, *VIDEO_TOKEN_IDS)


def time_major(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with its log-mel features (frames, bins) instead of (bins, frames), and their
    masks as long as the frames."""
    features = batch["input_features"].transpose(1, 2)
    return _with_masks(batch, features, features.shape[1])


def fit_modality_tokens(
    model: torch.nn.Module, batch: dict[str, Any], config: PretrainedConfig, error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: a batch whose text holds as many image
    (audio) tokens as the model's features fill, when that is what the error says; else None."""
    found = _mismatch(error)
    token = _modality_token(config)
    if "input_ids" not in batch or not _is_id(token):
        return None
    if found is None:
        return (
            _placeholders(batch, int(token), error)
            or _mask_length(batch, error)
            or _token_types(batch, int(token), error)
        )
    tokens, features = found
    if tokens == features:  # (as many, but not what the model compares)
        selecting = _selecting_masks(batch)
        if selecting is not None:
            return selecting
    counted = _features_counted(model, tokens, features)
    if counted is None:
        return None
    # (where the features were counted in values, the text that many tokens long is cut back)
    fitted = _with_tokens(batch, int(token), counted, shortest=tokens == features)
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        fitted["mm_token_type_ids"] = (fitted["input_ids"] == token).long()  # (M-RoPE's)
    return fitted


def _mismatch(error: Exception) -> tuple[int, int] | None:
    """The numbers of modality tokens and of features, where the error says they differ."""
    found = MISMATCH.search(str(error)) or PLACEHOLDERS.search(str(error))
    if found is not None:
        return int(found.group(1)), int(found.group(2))
    found = FEATURES_FOR.search(str(error))
    return None if found is None else (int(found.group(2)), int(found.group(1)))


BOUNDARY = re.compile(r"Expected (\d+) visual boundary tokens with id (\d+), but found 0")


def fit_boundary_tokens(
    config: PretrainedConfig, batch: dict[str, Any], error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: a batch whose runs of image (video) tokens
    are opened or closed by the boundary token the model says it needs (Ovis 2.5 embeds its
    start and end tokens as visual indicators), one per run, on the text token before (the
    config's *_start_token_id) or after (its *_end_token_id) the run; else None."""
    found = BOUNDARY.search(str(error))
    ids, token = batch.get("input_ids"), _modality_token(config)
    if found is None or ids is None or not _is_id(token):
        return None
    wanted, boundary = int(found.group(1)), int(found.group(2))
    names = [n for n, v in vars(config).items() if v == boundary and n.endswith("_token_id")]
    step = -1 if any(n.endswith("_start_token_id") for n in names) else 1
    if not names or (step == 1 and not any(n.endswith("_end_token_id") for n in names)):
        return None
    ids = ids.clone()
    runs = [row for row in range(len(ids)) if (ids[row] == token).any()]
    for row in runs:
        where = (ids[row] == token).nonzero().flatten()
        at = int(where[0]) - 1 if step < 0 else int(where[-1]) + 1
        if not 0 <= at < ids.shape[1] or ids[row, at] == token:
            return None
        ids[row, at] = boundary
    if len(runs) != wanted:
        return None
    fitted = dict(batch, input_ids=ids)
    if "labels" in batch and batch["labels"].shape == ids.shape:
        fitted["labels"] = ids.masked_fill(ids == token, -100)
    return fitted


def _features_counted(model: torch.nn.Module, tokens: int, features: int) -> int | None:
    """The number of features a mismatch error reports. Where it says tokens and features do
    not match while its numbers are equal, its features number counts values, features x
    their width (PaddleOCR-VL's message, once the text has that many tokens): the features
    are that over the width of the text's embeddings; else None."""
    if tokens != features:
        return features
    embeddings = model.get_input_embeddings()
    width = getattr(embeddings, "embedding_dim", 0)
    if not width or features % width:
        return None
    return features // width


def _placeholders(batch: dict[str, Any], token: int, error: Exception) -> dict[str, Any] | None:
    """Two modality tokens in a text that has none, where the model found nowhere to put its
    features: a model that expands one token per item itself when none are consecutive (a
    legacy processor's text) then counts the expanded tokens against its features, and says
    how many it needs."""
    if NO_PLACEHOLDER.search(str(error)) is None or (batch["input_ids"] == token).any():
        return None
    return _with_tokens(batch, token, 2)


TYPES_REQUIRED = "`mm_token_type_ids` is required"


def _token_types(batch: dict[str, Any], token: int, error: Exception) -> dict[str, Any] | None:
    """The batch with each token's modality (1 for an image token), where the model says it
    requires them (Molmo 2 in training), and they are not there yet."""
    if TYPES_REQUIRED not in str(error) or "mm_token_type_ids" in batch:
        return None
    return dict(batch, mm_token_type_ids=(batch["input_ids"] == token).long())


def _selecting_masks(batch: dict[str, Any]) -> dict[str, Any] | None:
    """The batch with its feature masks boolean, where the model counts as many tokens as
    features yet finds them different: a model that selects its projected features with the
    mask (Granite Speech's, which a long mask indexes instead); else None."""
    masks = [n for n in FEATURE_MASKS & set(batch) if batch[n].dtype != torch.bool]
    return {**batch, **{n: batch[n].bool() for n in masks}} if masks else None


MASK_SHAPE = re.compile(r"mask \[(\d+), (\d+)\] at index 1 does not match .* tensor \[\d+, (\d+)")


def _mask_length(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """The batch with its boolean feature masks as long as the features they select, where
    the model says they do not match (its projected features, fewer than the frames)."""
    found = MASK_SHAPE.search(str(error))
    if found is None:
        return None
    frames, length = int(found.group(2)), int(found.group(3))
    masks = [n for n in FEATURE_MASKS & set(batch) if batch[n].dtype == torch.bool]
    masks = [n for n in masks if batch[n].shape[-1] == frames]
    ones = torch.ones(BATCH, length, dtype=torch.bool)
    return {**batch, **dict.fromkeys(masks, ones)} if masks else None


def _is_id(value: Any) -> bool:
    """A token id (an int, not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _with_tokens(
    batch: dict[str, Any], token: int, features: int, shortest: bool = False
) -> dict[str, Any]:
    """The batch with `features` modality tokens after each row's first token: split between
    the rows when every row has its own image, else all in the first row; its text as long as
    before, or (shortest) as long as the sweep's text or the tokens need."""
    ids = batch["input_ids"]
    per_image = [features // ids.shape[0]] * ids.shape[0]
    pixels = batch.get("pixel_values")
    if not (isinstance(pixels, torch.Tensor) and pixels.dim() == 4 and len(pixels) == len(ids)):
        per_image = [features] + [0] * (ids.shape[0] - 1)
    length = max(SEQ if shortest else ids.shape[1], max(per_image) + LOW)
    rows = []
    for row, n in zip(ids, per_image, strict=True):
        text = row[row != token]
        filler = text[1:].repeat(length)[: length - 1 - n]
        rows.append(torch.cat([text[:1], torch.full((n,), token), filler]))
    fitted = dict(batch, input_ids=torch.stack(rows))
    if "attention_mask" in batch:
        fitted["attention_mask"] = torch.ones_like(fitted["input_ids"])
    if "labels" in batch and batch["labels"].shape == ids.shape:
        fitted["labels"] = fitted["input_ids"].masked_fill(fitted["input_ids"] == token, -100)
    return fitted


LENGTH_IS = re.compile(r"of length (\d+), but found (\d+)")
MULTIPLE = (  # "... a multiple of `n_window * 2` (100), but got 128"; "length N is not a multiple of M"
    re.compile(r"multiple of[^()]*\((\d+)\), but got (\d+)"),
    re.compile(r"length (\d+) is not a multiple of (\d+)"),
)
SHORT = "Kernel size can't be greater than actual input size"
FLAT_PATCHES = "Expected 3D (unbatched) or 4D (batched) input to conv2d"
UNPACK = re.compile(r"not enough values to unpack \(expected (\d+), got (\d+)\)")
BOTH_AUDIO = "cannot specify both input_values and input_features"
MASK_DTYPE = "Expected attn_mask dtype to be bool or float"
NORMALIZED = re.compile(
    r"normalized_shape=\[(\d+)\], expected input with shape \[\*, \d+\], but got"
)


def fit_length(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: a batch whose audio is as long as the model
    says it must be (log-mel features padded to 3000 frames as Whisper's feature extractor
    pads them, a waveform cut to a multiple of a codec's frame, or a codec encoder's mono
    waveform made longer where its strides leave too little), or without an attention
    mask the model wants as a float (an encoder's own additive mask, which its full model
    makes from the features' mask), or with only a waveform where the model takes a waveform
    or features but not both; else None."""
    message = str(error)
    if MASK_DTYPE in message and "attention_mask" in batch and "input_ids" not in batch:
        return {k: v for k, v in batch.items() if k != "attention_mask"}
    if BOTH_AUDIO in message and "input_values" in batch:  # (a waveform encoder's model)
        return {k: v for k, v in batch.items() if k != "input_features"}
    name = next((n for n in ("input_features", "input_values") if n in batch), None)
    exact, multiple = LENGTH_IS.search(message), MULTIPLE[0].search(message)
    other = MULTIPLE[1].search(message)
    if SHORT in message and _mono(batch.get("hidden_states")):  # (a codec's encoder alone)
        name = "hidden_states"
    if name is None:
        return None
    if SHORT in message and name in ("input_values", "hidden_states"):  # (strided down)
        values = batch[name]
        return _with_length(batch, name, values.dim() - 1, values.shape[-1] * 4)
    if exact is not None:
        wanted, found = int(exact.group(1)), int(exact.group(2))
    elif multiple is not None or other is not None:
        step, found = (
            (int(multiple.group(1)), int(multiple.group(2)))
            if multiple is not None
            else (int(other.group(2)), int(other.group(1)))  # type: ignore[union-attr]
        )
        wanted = -(-found // step) * step
    else:
        return None
    values = batch[name]
    dims = [d for d in range(1, values.dim()) if values.shape[d] == found]
    if not dims:
        return None
    return _with_length(batch, name, dims[-1], wanted)


FRAMES_DIFFER = re.compile(
    r"Sizes of tensors must match except in dimension 1\. Expected size (\d+) but got size "
    r"(\d+) for tensor number 1"
)


def fit_semantic_frames(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: time-major features as many frames as the
    waveform makes, where the model joins the frames of both (XCodec2's semantic features and
    acoustic encoding, one frame per 320 samples each); else None."""
    found = FRAMES_DIFFER.search(str(error))
    features = batch.get("input_features")
    if found is None or "input_values" not in batch or not isinstance(features, torch.Tensor):
        return None
    if features.dim() != 3 or features.shape[1] != int(found.group(1)):
        return None
    return _with_length(batch, "input_features", 1, int(found.group(2)))


def _mono(values: Any) -> bool:
    """A batch of (batch, 1, samples) waveforms."""
    return isinstance(values, torch.Tensor) and values.dim() == 3 and values.shape[1] == 1


def fit_features_width(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: time-major features as wide as the layer norm
    that first reads them (Wav2Vec2-BERT's stacked frames); else None."""
    found = NORMALIZED.search(str(error))
    if found is None or "input_features" not in batch:
        return None
    width = int(found.group(1))
    if batch["input_features"].shape[-1] == width:
        return None
    g = torch.Generator().manual_seed(SEED)
    return _with_masks(batch, torch.randn(BATCH, SEQ * 4, width, generator=g), SEQ * 4)


PER_TOKEN = re.compile(r"Expected input batch_size \((\d+)\) to match target batch_size \((\d+)\)")


def fit_token_labels(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: labels of the next tokens of the text instead of
    one class per item, where the model's loss reads a label per token (ShieldGemma 2 scores
    its image with its language model's own loss, its classes two of its tokens); else None."""
    found = PER_TOKEN.search(str(error))
    ids, labels = batch.get("input_ids"), batch.get("labels")
    if found is None or ids is None or labels is None or labels.shape != (len(ids),):
        return None
    if int(found.group(2)) != len(ids) or int(found.group(1)) % len(ids):
        return None
    return dict(batch, labels=ids.clone())


NO_CHANNEL = "Dimension out of range (expected to be in range of [-3, 2], but got 3)"


def fit_features_channel(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: log-mel features as a one-channel image,
    (batch, 1, frames, bins), where the model reads a fourth dimension of them (CLAP's audio
    encoder, a Swin over the spectrogram); else None."""
    features = batch.get("input_features")
    if NO_CHANNEL not in str(error) or not isinstance(features, torch.Tensor):
        return None
    if features.dim() != 3:
        return None
    major = time_major(batch)
    return dict(major, input_features=major["input_features"].unsqueeze(1))


MATMUL = re.compile(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x\d+\)")
WIDER = re.compile(
    r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\) at non-singleton dimension 2"
)


def fit_stacked_frames(
    config: PretrainedConfig, batch: dict[str, Any], error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: time-major features a whole number of times
    as wide as the mel bins, where the first layer that reads them (a linear layer, or a
    position encoding added to them) says so: stacked frames (Granite Speech 5 reads each
    frame with its delta, two frames stacked: 4 x 80; Fun-ASR 7 frames: 7 x 80); else None."""
    features = batch.get("input_features")
    bins = _find(config, "num_mel_bins")
    if not isinstance(features, torch.Tensor) or features.dim() != 3:
        return None
    if (found := MATMUL.search(str(error))) is not None:
        rows, width, wanted = (int(x) for x in found.groups())
    elif (found := WIDER.search(str(error))) is not None:
        rows, (width, wanted) = features.shape[0] * features.shape[1], map(int, found.groups())
    else:
        return None
    frames = features.shape[0] * features.shape[1]
    if rows != frames or width != features.shape[2] or width != bins or wanted % width:
        return None
    g = torch.Generator().manual_seed(SEED)
    return _with_masks(batch, torch.randn(BATCH, SEQ * 4, wanted, generator=g), SEQ * 4)


def fit_patch_images(
    config: PretrainedConfig, batch: dict[str, Any], error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: flattened patches as small images (patches,
    channels, patch, patch), where the model's patch embedding is a 2-D convolution (Kimi's
    vision tower, or PaddleOCR-VL's, which unpacks the two more dimensions the flat patch
    width splits into); else None."""
    pixels = batch.get("pixel_values")
    patch = _find(config, "patch_size")
    unpack = UNPACK.search(str(error))
    split = unpack is not None and int(unpack.group(1)) == int(unpack.group(2)) + 2
    if not (FLAT_PATCHES in str(error) or split):
        return None
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 2:
        return None
    if not _is_id(patch) or pixels.shape[1] % (patch * patch):
        return None
    return dict(batch, pixel_values=pixels.view(len(pixels), -1, patch, patch))


PADDED = re.compile(
    r"shape of the mask \[(\d+), (\d+)\] at index 0 does not match the shape of the indexed "
    r"tensor \[(\d+), \2\] at index 0"
)


def fit_padded_patches(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: flattened patches padded per image, (images,
    patches, width), where the model unpads them by its grid (ColQwen2's processor pads them);
    else None."""
    found = PADDED.search(str(error))
    pixels, grid = batch.get("pixel_values"), batch.get("image_grid_thw")
    if found is None or not isinstance(pixels, torch.Tensor) or pixels.dim() != 2:
        return None
    if not isinstance(grid, torch.Tensor) or int(found.group(1)) != len(grid):
        return None
    if int(found.group(3)) != len(pixels) or len(grid) != 1:
        return None
    return dict(batch, pixel_values=pixels.unsqueeze(0))


TILES = re.compile(r"shape '\[-1, (\d+), (\d+), \1, \2, \d+\]' is invalid for input of size")


def fit_token_tiles(
    config: PretrainedConfig, batch: dict[str, Any], error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: flattened patches as one channels-last tile of
    merge x merge patches per language-model token, and their grid counted in those tokens
    (Inkling 2's vision tower cuts each tile into its patches itself), where the model's
    reshape says so; else None."""
    found = TILES.search(str(error))
    pixels, grid = batch.get("pixel_values"), batch.get("image_grid_thw")
    if found is None or not isinstance(pixels, torch.Tensor) or pixels.dim() != 2:
        return None
    merge, patch = int(found.group(1)), int(found.group(2))
    channels = int(_find(config, "num_channels", "in_channels") or 3)
    side = merge * patch
    if not isinstance(grid, torch.Tensor) or pixels.numel() % (side * side * channels):
        return None
    tiles = pixels.reshape(-1, side, side, channels)
    return dict(batch, pixel_values=tiles, image_grid_thw=grid // torch.tensor([1, merge, merge]))


CHANNELS = re.compile(r"expected input\[(\d+), (\d+), (\d+)\] to have (\d+) channels, but got")


def fit_channels(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: hidden states channels-first, as many
    channels as the first convolution says (a codec's encoder reads a mono waveform, its
    decoder latents as wide as its hidden size, where its latent_dim is its quantizer's:
    Pocket TTS's decoder); else None."""
    found = CHANNELS.search(str(error))
    name = next((n for n in ("hidden_states", "latents") if n in batch), "")
    states = batch.get(name)
    if found is None or not isinstance(states, torch.Tensor) or states.dim() != 3:
        return None
    if states.shape[1] != int(found.group(2)) or len(batch) != 1:
        return None
    channels = int(found.group(4))
    length = WAVEFORM if channels == 1 else states.shape[2] if name == "latents" else SEQ
    g = torch.Generator().manual_seed(SEED)
    return {name: torch.randn(BATCH, channels, length, generator=g)}


PAIRS = "Input must be a 5D tensor of shape (batch_size, 2,"
TOO_SMALL = ("Given input with spatial size", "Output size is too small", "too small to be scaled")


def fit_images(batch: dict[str, Any], error: Exception) -> dict[str, Any] | None:
    """After a trial forward failed with error: images as the model says it reads them, else
    None. Each item as a list of one image (a video of one frame) where the model unpacks
    one more dimension than the images have; a pair of images per item (keypoint matching);
    images twice as large where the last stage of a convolutional network is left with
    nothing."""
    pixels = batch.get("pixel_values")
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4:
        return None
    message = str(error)
    unpack = UNPACK.search(message)
    if unpack is not None and int(unpack.group(1)) == int(unpack.group(2)) + 1:
        return dict(batch, pixel_values=pixels.unsqueeze(1))
    if PAIRS in message:
        return dict(batch, pixel_values=torch.stack([pixels, pixels.flip(0)], dim=1))
    if any(m in message for m in TOO_SMALL) and pixels.shape[-1] < MAX_SIDE:
        return larger_images(batch)
    return None


def larger_images(batch: dict[str, Any]) -> dict[str, Any]:
    """The batch with images twice as high and wide (new random pixels)."""
    pixels = batch["pixel_values"]
    g = torch.Generator().manual_seed(SEED)
    shape = (*pixels.shape[:-2], pixels.shape[-2] * 2, pixels.shape[-1] * 2)
    return dict(batch, pixel_values=torch.randn(shape, generator=g))


CODEBOOKS = re.compile(r"shape '\[-1, (\d+), (\d+)\]' is invalid for input of size")


def fit_codebooks(
    config: PretrainedConfig, batch: dict[str, Any], error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: text of one row per codebook (MusicGen's
    decoder reads (batch x codebooks, length) ids, and its labels are (batch, length,
    codebooks)), where the model says so; else None."""
    found = CODEBOOKS.search(str(error))
    books = _find(config, "num_codebooks")
    ids = batch.get("input_ids")
    if found is None or not _is_id(books) or int(found.group(1)) != books or ids is None:
        return None
    if ids.shape[0] != BATCH:
        return None
    rows = ids.repeat_interleave(books, dim=0)
    fitted = dict(batch, input_ids=rows)
    if "attention_mask" in batch:
        fitted["attention_mask"] = torch.ones(BATCH, ids.shape[1], dtype=torch.long)
    if "labels" in batch:
        fitted["labels"] = rows.view(BATCH, books, -1).transpose(1, 2).contiguous()
    return fitted


STREAMS = re.compile(r"size of tensor a \((\d+)\) must match the size of tensor b \((\d+)\)")


def fit_audio_streams(
    config: PretrainedConfig, batch: dict[str, Any], error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: text of (batch, length, 1 + codebooks) ids, a
    text token and one audio code per codebook at each step (Kyutai's speech-to-text embeds
    the sum of its text and audio streams), where the model says it adds one offset per
    stream; else None. Its labels stay the text."""
    found = STREAMS.search(str(error))
    books = _find(config, "num_codebooks")
    ids = batch.get("input_ids")
    if found is None or not _is_id(books) or ids is None or ids.dim() != 2:
        return None
    if int(found.group(1)) != ids.shape[1] or int(found.group(2)) != books + 1:
        return None
    codes = int(_find(config, "codebook_vocab_size") or books) - 1  # (its last id: a BOS code)
    g = torch.Generator().manual_seed(SEED)
    audio = torch.randint(0, codes, (*ids.shape, books), generator=g)
    return dict(batch, input_ids=torch.cat([ids.unsqueeze(-1), audio], dim=-1))


DECODER_CHANNELS = re.compile(r"shape '\[(\d+), (\d+), -1\]' is invalid for input of size")


def fit_decoder_channels(
    config: PretrainedConfig, batch: dict[str, Any], error: Exception
) -> dict[str, Any] | None:
    """After a trial forward failed with error: decoder ids of one code per audio channel at
    each step, (batch, length, channels), where the model says it reads them so (Dia's, whose
    own reshape of (batch x channels, length) ids then fails to view them), and labels of one
    row per channel (its logits' rows); else None."""
    found = DECODER_CHANNELS.search(str(error))
    ids = batch.get("decoder_input_ids")
    channels = _find(config, "num_channels")
    if found is None or ids is None or not _is_id(channels) or ids.dim() != 2:
        return None
    if int(found.group(1)) != ids.shape[0] or int(found.group(2)) != channels:
        return None
    rows = ids.repeat_interleave(channels, dim=0)
    codes = rows.view(len(ids), channels, -1).transpose(1, 2).contiguous()
    fitted = dict(batch, decoder_input_ids=codes)
    if "labels" in batch and batch["labels"].shape == ids.shape:
        fitted["labels"] = batch["labels"].repeat_interleave(channels, dim=0)
    return fitted


def _with_length(batch: dict[str, Any], name: str, dim: int, length: int) -> dict[str, Any]:
    """The batch with its audio (name) `length` long in dimension dim: repeated to length."""
    values = batch[name]
    times = -(-length // values.shape[dim])
    longer = values.repeat(*[times if d == dim else 1 for d in range(values.dim())])
    longer = longer.narrow(dim, 0, length).contiguous()
    return (
        _with_masks(batch, longer, length, name)
        if name == "input_features"
        else {**batch, name: longer}
    )


def _with_masks(
    batch: dict[str, Any], features: torch.Tensor, frames: int, name: str = "input_features"
) -> dict[str, Any]:
    """The batch with these features, and their masks `frames` long (every frame is speech)."""
    ones = torch.ones(BATCH, frames, dtype=torch.long)
    return {**batch, name: features, **dict.fromkeys(_feature_masks(batch, batch), ones)}


def _feature_masks(batch: dict[str, Any], names: Any) -> set[str]:
    """The masks among names that cover audio frames: attention_mask too where there is no
    text (whose mask it is otherwise)."""
    audio_only = "input_ids" not in batch
    return (FEATURE_MASKS | ({"attention_mask"} if audio_only else set())) & set(names)
