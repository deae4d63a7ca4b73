"""The zoo's plain torch.nn models: recurrent taggers on packed batches, nn.Transformer, a CNN.

Like transformers models, each forward takes the batch as keyword arguments and returns a dict
with the "loss" and the other outputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from batches import CLASSES, image_batch, packed_text_batch, translation_batch
from cases import Case, seeded
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

TOKENS = 100  # vocabulary of the plain models' batches
WIDTH = 32


def tagging_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over every position; label -100 is ignored."""
    return F.cross_entropy(logits.flatten(0, -2), labels.flatten(), ignore_index=-100)


class Tagger(nn.Module):
    """Embedding, a 2-layer recurrent net over a packed batch, and a linear tag head."""

    def __init__(self, rnn: type[nn.LSTM | nn.GRU], bidirectional: bool) -> None:
        """rnn: nn.LSTM or nn.GRU."""
        super().__init__()
        self.embed = nn.Embedding(TOKENS, WIDTH, padding_idx=0)
        self.rnn = rnn(WIDTH, WIDTH, 2, batch_first=True, dropout=0.1, bidirectional=bidirectional)
        self.head = nn.Linear(WIDTH * (2 if bidirectional else 1), CLASSES)

    def forward(
        self, input_ids: torch.Tensor, lengths: torch.Tensor, labels: torch.Tensor
    ) -> dict[str, object]:
        """Tags every token; the packed sequence skips the pads (lengths go to the CPU)."""
        x = self.embed(input_ids)
        packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
        out, hidden = self.rnn(packed)
        out, _ = pad_packed_sequence(out, batch_first=True, total_length=input_ids.shape[1])
        logits = self.head(out)
        return {"loss": tagging_loss(logits, labels), "logits": logits, "hidden": hidden}


class Translator(nn.Module):
    """nn.Transformer (2 + 2 layers) with learned positions and a causal, padded attention."""

    def __init__(self) -> None:
        """Embeddings of width WIDTH shared by source and target, and an output head."""
        super().__init__()
        self.embed = nn.Embedding(TOKENS, WIDTH)
        self.position = nn.Embedding(16, WIDTH)
        self.transformer = nn.Transformer(WIDTH, 4, 2, 2, 64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(WIDTH, TOKENS)

    def embedded(self, ids: torch.Tensor) -> torch.Tensor:
        """Token plus position embeddings."""
        return self.embed(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))

    def forward(
        self,
        src: torch.Tensor,
        src_padding: torch.Tensor,
        tgt: torch.Tensor,
        labels: torch.Tensor,
    ) -> dict[str, object]:
        """Next-token logits for the target, attending to the unpadded source."""
        causal = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        hidden = self.transformer(
            self.embedded(src),
            self.embedded(tgt),
            tgt_mask=causal,
            src_key_padding_mask=src_padding,
            memory_key_padding_mask=src_padding,
            tgt_is_causal=True,
        )
        logits = self.head(hidden)
        return {"loss": tagging_loss(logits, labels), "logits": logits, "hidden": hidden}


class ConvNet(nn.Module):
    """Two conv + BatchNorm + ReLU blocks, max and average pooling, a linear classifier."""

    def __init__(self) -> None:
        """8 and 16 channels."""
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
        )
        self.classifier = nn.Linear(16, CLASSES)

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> dict[str, object]:
        """Class logits and their cross-entropy."""
        features = self.features(pixel_values)
        logits = self.classifier(features)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits, "features": features}


def nn_cases() -> list[Case]:
    """The plain torch.nn entries of the zoo."""
    return [
        Case("lstm", "rnn", seeded(lambda: Tagger(nn.LSTM, False)), packed_text_batch),
        Case("gru", "rnn", seeded(lambda: Tagger(nn.GRU, True)), packed_text_batch),
        Case("transformer", "nn", seeded(Translator), translation_batch),
        Case("cnn", "nn", seeded(ConvNet), image_batch),
    ]
