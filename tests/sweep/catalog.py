"""Every model type of the installed transformers that has a model class, and the classes of it
the sweep trains.

transformers' auto mappings say which classes exist for a model type: its base model
(MODEL_MAPPING_NAMES) and one class per head (MODEL_FOR_CAUSAL_LM_MAPPING_NAMES...). A type
is attempted when any mapping names a class for it. Its primary target is its first head in
HEAD_ORDER whose inputs and labels the sweep knows how to make; a type with none of those
trains its base model against a loss on its outputs. `--all-heads` adds every other known head.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from transformers.models.auto import configuration_auto, modeling_auto

# Heads the input generator makes labels for, in the order a type's primary target is chosen:
# the head most of that type's users train first (an encoder-decoder's generation head before
# its decoder alone, a masked LM before the causal head an encoder may also have). "model" is the base model (a loss on its
# outputs).
HEAD_ORDER = (
    "seq2seq_lm",
    "speech_seq2seq",
    "ctc",
    "masked_lm",
    "causal_lm",
    "image_classification",
    "audio_classification",
    "sequence_classification",
    "token_classification",
    "image_text_to_text",
    "multimodal_lm",
    "question_answering",
    "model",
)
MAPPINGS = {
    "causal_lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked_lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq_lm": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "speech_seq2seq": "MODEL_FOR_SPEECH_SEQ_2_SEQ_MAPPING_NAMES",
    "ctc": "MODEL_FOR_CTC_MAPPING_NAMES",
    "image_classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
    "audio_classification": "MODEL_FOR_AUDIO_CLASSIFICATION_MAPPING_NAMES",
    "sequence_classification": "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES",
    "token_classification": "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES",
    "image_text_to_text": "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES",
    "multimodal_lm": "MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES",
    "question_answering": "MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES",
    "model": "MODEL_MAPPING_NAMES",
}


@dataclass(frozen=True)
class Target:
    """One class the sweep trains: model type, head, class name and its config class's name."""

    model_type: str
    head: str
    model_class: str
    config_class: str

    @property
    def key(self) -> str:
        """Its name in results and on the command line: TYPE or TYPE:HEAD."""
        return f"{self.model_type}:{self.head}"


def _names(value: str | tuple[str, ...]) -> str:
    """A mapping's class name (the first, where it lists several)."""
    return value if isinstance(value, str) else value[0]


@cache
def all_mappings() -> dict[str, set[str]]:
    """model type -> every auto mapping (by name) that has a class for it."""
    found: dict[str, set[str]] = {}
    for name in dir(modeling_auto):
        if name.startswith("MODEL_") and name.endswith("_MAPPING_NAMES"):
            for model_type in getattr(modeling_auto, name):
                found.setdefault(model_type, set()).add(name)
    return found


def heads_of(model_type: str) -> dict[str, str]:
    """The known heads of a type, in HEAD_ORDER: head -> class name."""
    heads = {}
    for head in HEAD_ORDER:
        classes = getattr(modeling_auto, MAPPINGS[head])
        if model_type in classes:
            heads[head] = _names(classes[model_type])
    return heads


def model_types() -> list[str]:
    """Every model type with a config class and at least one model class, sorted."""
    configs = configuration_auto.CONFIG_MAPPING_NAMES
    return sorted(t for t in all_mappings() if t in configs)


def targets(all_heads: bool = False) -> list[Target]:
    """Each type's primary target (its first known head), or every known head."""
    found = []
    for model_type in model_types():
        config = configuration_auto.CONFIG_MAPPING_NAMES[model_type]
        heads = heads_of(model_type)
        chosen = list(heads.items()) if all_heads else list(heads.items())[:1]
        if not chosen:  # only heads the generator cannot feed: the first mapping's class
            mapping = min(all_mappings()[model_type])
            cls = _names(getattr(modeling_auto, mapping)[model_type])
            chosen = [("other", cls)]
        found.extend(Target(model_type, head, cls, config) for head, cls in chosen)
    return found


def head_count(model_type: str) -> int:
    """How many classes (base and heads) the auto mappings name for the type."""
    return len(all_mappings().get(model_type, ()))
