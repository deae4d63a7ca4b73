"""Deterministic CPU batches for the zoo: token ids, images, audio, each with its labels."""

from __future__ import annotations

from typing import Any

import torch

Batch = dict[str, Any]  # keyword arguments of the model's forward: tensors, and a few flags

VOCAB = 1000
SEQ = 17
PAD_AFTER = 12  # the second row of the padded text batch has this many real tokens
BATCH_SEED = 5678
CLASSES = 10
IMAGE = 32  # images are IMAGE x IMAGE pixels, 3 channels


def _generator() -> torch.Generator:
    """The CPU generator every batch is drawn from."""
    return torch.Generator().manual_seed(BATCH_SEED)


def _right_padded(ids: torch.Tensor, lengths: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids with pad 0 after each row's length, and the attention mask."""
    mask = torch.zeros_like(ids)
    for row, length in enumerate(lengths):
        mask[row, :length] = 1
    return ids.masked_fill(mask == 0, 0), mask


def padded_text_batch() -> Batch:
    """2 x SEQ token ids; the second row is right-padded after PAD_AFTER tokens."""
    ids, mask = _right_padded(torch.randint(3, VOCAB, (2, SEQ), generator=_generator()), [SEQ, 12])
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def text_batch() -> Batch:
    """2 x 16 token ids, no padding, labels = inputs (the model shifts them)."""
    ids = torch.randint(3, VOCAB, (2, 16), generator=_generator())
    return {"input_ids": ids, "labels": ids.clone()}


def masked_lm_batch() -> Batch:
    """2 x 16 token ids with about 15% replaced by [MASK] (id 4); labels only at those places."""
    g = _generator()
    ids = torch.randint(5, VOCAB, (2, 16), generator=g)
    masked = torch.rand(2, 16, generator=g) < 0.15
    masked[:, 3] = True  # at least one label per row
    return {
        "input_ids": ids.masked_fill(masked, 4),
        "attention_mask": torch.ones(2, 16, dtype=torch.long),
        "labels": ids.masked_fill(~masked, -100),
    }


def seq2seq_batch() -> Batch:
    """Encoder ids 2 x 12 (second row padded after 9) and decoder labels 2 x 8."""
    g = _generator()
    ids, mask = _right_padded(torch.randint(3, VOCAB, (2, 12), generator=g), [12, 9])
    labels = torch.randint(3, VOCAB, (2, 8), generator=g)
    labels[1, 6:] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def image_batch() -> Batch:
    """4 RGB images and their class labels."""
    g = _generator()
    pixels = torch.randn(4, 3, IMAGE, IMAGE, generator=g)
    return {"pixel_values": pixels, "labels": torch.randint(0, CLASSES, (4,), generator=g)}


def segmentation_batch() -> Batch:
    """4 RGB images and a class per pixel."""
    g = _generator()
    pixels = torch.randn(4, 3, IMAGE, IMAGE, generator=g)
    return {
        "pixel_values": pixels,
        "labels": torch.randint(0, CLASSES, (4, IMAGE, IMAGE), generator=g),
    }


def characters_batch() -> Batch:
    """2 x 32 unicode code points (character-level models hash them) and a tag per character."""
    g = _generator()
    ids = torch.randint(32, 0x250, (2, 32), generator=g)
    return {
        "input_ids": ids,
        "attention_mask": torch.ones(2, 32, dtype=torch.long),
        "labels": torch.randint(0, CLASSES, (2, 32), generator=g),
    }


def audio_batch() -> Batch:
    """2 log-mel spectrograms (16 bins x 32 frames) and decoder labels 2 x 8."""
    g = _generator()
    features = torch.randn(2, 16, 32, generator=g)
    return {"input_features": features, "labels": torch.randint(3, VOCAB, (2, 8), generator=g)}


def waveform_batch() -> Batch:
    """2 raw waveforms of 1600 samples and CTC labels (characters 3..31; the second padded)."""
    g = _generator()
    labels = torch.randint(3, 32, (2, 6), generator=g)
    labels[1, 4:] = -100
    return {"input_values": torch.randn(2, 1600, generator=g), "labels": labels}


def image_text_batch() -> Batch:
    """2 captions (the second padded after 6 tokens) and 2 images; CLIP's contrastive loss."""
    g = _generator()
    ids, mask = _right_padded(torch.randint(3, VOCAB, (2, 8), generator=g), [8, 6])
    pixels = torch.randn(2, 3, IMAGE, IMAGE, generator=g)
    return {"input_ids": ids, "attention_mask": mask, "pixel_values": pixels, "return_loss": True}


def packed_text_batch() -> Batch:
    """3 sequences of lengths 7, 10 and 4 (unsorted) padded to 10, tags per token (-100 at pads)."""
    g = _generator()
    lengths = torch.tensor([7, 10, 4])
    ids, mask = _right_padded(torch.randint(1, 100, (3, 10), generator=g), lengths.tolist())
    tags = torch.randint(0, CLASSES, (3, 10), generator=g).masked_fill(mask == 0, -100)
    return {"input_ids": ids, "lengths": lengths, "labels": tags}


def translation_batch() -> Batch:
    """Source ids 2 x 12 (the second padded after 8), target ids 2 x 9 and next-token labels."""
    g = _generator()
    src, src_mask = _right_padded(torch.randint(1, 100, (2, 12), generator=g), [12, 8])
    tgt = torch.randint(1, 100, (2, 10), generator=g)
    return {"src": src, "src_padding": src_mask == 0, "tgt": tgt[:, :-1], "labels": tgt[:, 1:]}
