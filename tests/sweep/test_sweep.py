"""The sweep's parts on a few architectures: the shrinker keeps an architecture while making it
small, the input generator feeds each kind of head, traits come from modules, and the runner
trains a target in every mode, caches its result and resumes from the cache. `make sweep` runs
every model type."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
from catalog import Target, heads_of, targets
from inputs import make_batch
from report import representative, summary
from shrink import shrink
from traits import traits
from worker import build, repeatable_seed

SWEEP = Path(__file__).with_name("sweep.py")


def _built(model_type: str, cls_name: str) -> tuple[torch.nn.Module, transformers.PretrainedConfig]:
    cls = getattr(transformers, cls_name)
    config = shrink(cls.config_class, model_type)
    return cls(config), config


@pytest.mark.parametrize(
    ("model_type", "cls_name"),
    [
        ("llama", "LlamaForCausalLM"),
        ("swinv2", "Swinv2ForImageClassification"),
        ("whisper", "WhisperForConditionalGeneration"),
        ("llava", "LlavaForConditionalGeneration"),
        ("mixtral", "MixtralForCausalLM"),
    ],
)
def test_the_shrunk_model_is_small_and_trains_on_cpu(model_type: str, cls_name: str) -> None:
    head = next(h for h, c in heads_of(model_type).items() if c == cls_name)
    config_name = type(_built(model_type, cls_name)[1]).__name__
    model, batch, _config = build(Target(model_type, head, cls_name, config_name))
    assert sum(p.numel() for p in model.parameters()) < 3_000_000
    loss = model(**batch)["loss"]  # (a multimodal model's image tokens fitted by build)
    assert torch.isfinite(loss)
    loss.backward()


def test_the_shrinker_keeps_grouped_and_multi_query_attention() -> None:
    mistral, _ = _built("mistral", "MistralForCausalLM")
    falcon, _ = _built("falcon", "FalconForCausalLM")
    gpt2, _ = _built("gpt2", "GPT2LMHeadModel")
    assert "attention:gqa" in traits(mistral, mistral.config, {}, "causal_lm")
    assert mistral.config.num_key_value_heads < mistral.config.num_attention_heads
    assert "attention:mha" not in traits(falcon, falcon.config, {}, "causal_lm")
    assert "positions:absolute" in traits(gpt2, gpt2.config, {}, "causal_lm")


def test_a_hierarchical_backbone_keeps_its_stages_consistent() -> None:
    # SAM 2's Hiera: widths double from the patch embedding's, global blocks stay in the
    # stages they were in, and the vision config's copies of the stages follow the backbone.
    sam2 = shrink(transformers.Sam2Config, "sam2")
    hiera = sam2.vision_config.backbone_config
    widths = hiera.embed_dim_per_stage
    assert widths[0] == hiera.hidden_size and widths == [widths[0] * 2**i for i in range(4)]
    assert all(b < sum(hiera.blocks_per_stage) for b in hiera.global_attention_blocks)
    assert sam2.vision_config.backbone_channel_list == widths[::-1]


def test_torch_seed_is_repeatable_in_the_sweep() -> None:
    # Reformer calls torch.seed() in every training forward: the sweep's runs must agree.
    seeds = []
    for _ in range(2):
        torch.manual_seed(0)
        seeds.append((repeatable_seed(), torch.randn(3)))
    assert seeds[0][0] == seeds[1][0] and torch.equal(seeds[0][1], seeds[1][1])


def test_traits_come_from_modules() -> None:
    mixtral, config = _built("mixtral", "MixtralForCausalLM")
    found = traits(mixtral, config, {"input_ids": None}, "causal_lm")
    assert {"mlp:moe", "norm:rms", "positions:rotary", "input:tokens"} <= set(found)
    vit, config = _built("vit", "ViTForImageClassification")
    batch = make_batch(vit, "image_classification", config)
    assert "input:patches" in traits(vit, config, batch, "image_classification")


def test_every_model_type_with_a_model_class_is_a_target() -> None:
    keys = {t.model_type for t in targets()}
    assert len(keys) >= 500 and {"llama", "bert", "t5", "vit", "whisper"} <= keys
    assert next(t for t in targets() if t.model_type == "t5").head == "seq2seq_lm"


def test_the_report_counts_and_covers() -> None:
    results = [
        {"key": "a:causal_lm", "built": True, "traits": ["x", "y"], "params": 2}
        | {m: {"passed": True} for m in ("eager", "adaptive", "compiled")}
        | {"bits": {"equal": True}},
        {"key": "b:model", "built": True, "traits": ["y", "z"], "params": 1}
        | {m: {"passed": m != "compiled"} for m in ("eager", "adaptive", "compiled")}
        | {"bits": {"equal": True}},
        {"key": "c:model", "built": False},
        {"key": "d:model", "built": False}
        | {"failure": {"error": "ImportError: D requires the timm library but it was not found"}},
    ]
    text = summary(results)
    assert "attempted: 4 model types" in text and "built: 2 (50.0 %)" in text
    assert "of the 2 not built: 1 need a library not installed here (timm 1)" in text
    assert "compiled: 1 (50.0 %) of the built pass" in text
    assert [r["key"] for r in representative(results)] == ["a:causal_lm"]


def test_the_runner_trains_a_target_in_every_mode_and_resumes_from_its_cache(
    tmp_path: Path,
) -> None:
    command = [sys.executable, str(SWEEP), "gpt2", "--cache", str(tmp_path), "--jobs", "1"]
    registry = tmp_path / "shapes.jsonl"
    first = subprocess.run(
        [*command, "--record", str(registry), "--report", str(tmp_path / "SWEEP.md")],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert "1 to run" in first.stderr
    result = json.loads((tmp_path / "gpt2__causal_lm.json").read_text())
    for mode in ("eager", "adaptive", "compiled"):
        assert result[mode]["passed"], result[mode]
    assert result["bits"]["equal"]
    assert "all three modes: 1 (100.0 %)" in first.stdout
    assert "| gpt2:causal_lm | GPT2LMHeadModel |" in (tmp_path / "SWEEP.md").read_text()
    assert registry.stat().st_size > 0
    again = subprocess.run(command, capture_output=True, text=True, timeout=120, check=True)
    assert "1 cached" in again.stderr and "0 to run" in again.stderr
