"""An architecture's traits, read from the model it built (its modules, parameters, buffers and
config values), never from its name.

A trait is "kind:value": attention (mha, gqa, mqa, sliding, cross, ssm, linear), positions
(absolute, rotary, alibi, relative), norm (layer, rms, batch, group), mlp (plain, gated, moe),
input (tokens, patches, conv-stem, waveform, audio-features) and head.
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from torch import nn

QUERY = ("q_proj", "query", "q", "wq", "to_q", "q_lin")
KEY = ("k_proj", "key", "k", "wk", "to_k", "k_lin")
GATES = ("gate_proj", "w3", "gate_up_proj", "wi_0", "gate", "fc_gate")
CROSS = ("crossattention", "encoder_attn", "cross_attn", "cross_attention", "encdec_attention")


def _attention(model: nn.Module, config: Any) -> set[str]:
    """MHA, GQA or MQA from query and key projection widths; sliding, cross, SSM."""
    found = set()
    for module in model.modules():
        children = dict(module.named_children())
        q = next((children[n] for n in QUERY if isinstance(children.get(n), nn.Linear)), None)
        k = next((children[n] for n in KEY if isinstance(children.get(n), nn.Linear)), None)
        if q is not None and k is not None:
            if k.out_features == q.out_features:
                found.add("attention:mha")
            elif q.out_features % k.out_features == 0:
                heads = getattr(module, "num_heads", None) or _value(config, "num_attention_heads")
                ratio = q.out_features // k.out_features
                found.add("attention:mqa" if heads and ratio == heads else "attention:gqa")
        names = {name.lower() for name in children}
        if names & set(CROSS):
            found.add("attention:cross")
        if (
            hasattr(module, "A_log")
            or "dt_proj" in names
            or "x_proj" in names
            and "conv1d" in names
        ):
            found.add("attention:ssm")
        if "MultiheadAttention" == type(module).__name__:
            found.add("attention:mha")
    layer_types = str(_config_values(config, "layer_types", "attention_types", "attention_layers"))
    window = _config_values(config, "sliding_window", "window_size", "attention_window")
    if (
        "sliding" in layer_types
        or "local" in layer_types
        or any(isinstance(w, int) for w in window)
    ):
        found.add("attention:sliding")
    if "linear" in layer_types or "recurrent" in layer_types:
        found.add("attention:linear")
    plain = not found & {"attention:mha", "attention:gqa", "attention:mqa", "attention:ssm"}
    if plain and any("attention" in type(m).__name__.lower() for m in model.modules()):
        found.add("attention:fused-qkv")  # one projection for all three: the config says how
        kv = _config_values(config, "num_key_value_heads", "num_kv_heads", "n_head_kv")
        heads = _config_values(config, "num_attention_heads", "n_head", "n_heads")
        if _config_values(config, "multi_query") == [True] or kv[:1] == [1]:
            found.add("attention:mqa")
        elif kv and heads and isinstance(kv[0], int) and kv[0] < heads[0]:
            found.add("attention:gqa")
    return found


def _config_values(config: Any, *names: str) -> list[Any]:
    """The values of names on the config and its parts that are set."""
    parts = [config] + [v for v in vars(config).values() if hasattr(v, "model_type")]
    values = [_value(p, n) for p in parts for n in names]
    return [v for v in values if v is not None]


def _value(config: Any, name: str) -> Any:
    """config.name, or None where it is unset or refused (a per-layer attribute of a
    heterogeneous config raises rather than give one value for every layer)."""
    try:
        return getattr(config, name, None)
    except Exception:  # noqa: BLE001  (transformers' AmbiguousGlobalPerLayerAttributeError)
        return None


def _positions(model: nn.Module, config: Any) -> set[str]:
    """Absolute embeddings, rotary (an inv_freq buffer), ALiBi, relative bias."""
    found = set()
    for name, module in model.named_modules():
        leaf = name.rsplit(".", 1)[-1].lower()
        kind = type(module).__name__.lower()
        if "rotary" in kind or any(b == "inv_freq" for b, _ in module.named_buffers(recurse=False)):
            found.add("positions:rotary")
        if isinstance(module, nn.Embedding) and ("position" in leaf or leaf in ("wpe", "pos_emb")):
            found.add("positions:absolute")
        if isinstance(module, nn.Embedding) and "relative" in leaf:
            found.add("positions:relative")
        if "alibi" in kind:
            found.add("positions:alibi")
    for name, _param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1].lower()
        if "position_embedding" in leaf or leaf in ("pos_embed", "position_embeddings"):
            found.add("positions:absolute")
        if "relative_position" in leaf:
            found.add("positions:relative")
    flags = _config_values(config, "alibi")
    kind = str(_config_values(config, "position_embedding_type"))
    if flags == [True] or "alibi" in kind or not flags and _builds_alibi(model):
        found.add("positions:alibi")
    return found


def _builds_alibi(model: nn.Module) -> bool:
    """The model's own code builds ALiBi biases (BLOOM has no config flag for it)."""
    module = sys.modules.get(type(model).__module__)
    try:
        return module is not None and "def build_alibi_tensor" in inspect.getsource(module)
    except (OSError, TypeError):
        return False


def _norms(model: nn.Module) -> set[str]:
    """LayerNorm, RMSNorm, BatchNorm, GroupNorm."""
    found = set()
    for module in model.modules():
        kind = type(module).__name__.lower()
        if isinstance(module, nn.LayerNorm) or kind.endswith("layernorm") and "rms" not in kind:
            found.add("norm:layer")
        elif "rmsnorm" in kind or isinstance(module, nn.RMSNorm):
            found.add("norm:rms")
        elif isinstance(module, nn.modules.batchnorm._BatchNorm):
            found.add("norm:batch")
        elif isinstance(module, nn.GroupNorm):
            found.add("norm:group")
    return found


def _mlp(model: nn.Module) -> set[str]:
    """Gated MLPs (a gate projection), mixtures of experts (an experts container)."""
    found = set()
    for name, module in model.named_modules():
        children = {n.lower() for n, _ in module.named_children()}
        params = {n for n, _ in module.named_parameters(recurse=False)}
        if "experts" in children or name.endswith("experts") and params:
            found.add("mlp:moe")
        if children & set(GATES) or "gate_up_proj" in params:
            found.add("mlp:gated")
    return found or {"mlp:plain"}


def _inputs(model: nn.Module, batch: dict[str, Any]) -> set[str]:
    """What the model reads: tokens, image patches or a conv stem, waveform or features."""
    found = set()
    if "input_ids" in batch:
        found.add("input:tokens")
    if "pixel_values" in batch:
        convs = [m for m in model.modules() if isinstance(m, nn.Conv2d)]
        first = convs[0] if convs else None
        patch = first is not None and first.stride == first.kernel_size and first.stride[0] > 1
        found.add("input:patches" if patch else "input:conv-stem")
    if "input_values" in batch:
        found.add("input:waveform")
    if "input_features" in batch:
        found.add("input:audio-features")
    return found


def traits(model: nn.Module, config: Any, batch: dict[str, Any], head: str) -> list[str]:
    """Every trait of the built model, sorted."""
    found = _attention(model, config) | _positions(model, config) | _norms(model)
    found |= _mlp(model) | _inputs(model, batch) | {f"head:{head}"}
    return sorted(found)
