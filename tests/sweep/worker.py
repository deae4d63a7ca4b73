"""Runs one sweep target: shrinks its config, builds the model, makes its inputs, records its
traits, trains it on CPU, then in neuron eager, adaptive and compiled mode; prints one JSON line.

    .venv/bin/python tests/sweep/worker.py TYPE:HEAD [--steps 3] [--build-only]

The target "builds" when the model is constructed from the shrunk config and trains on the
CPU; a failure before that is the shrinker's, the input generator's or transformers' own, and
its stage says which. The modes are judged as the zoo judges them (tests/zoo/verdict.py):
eager, adaptive and compiled against CPU within the zoo's tolerances, adaptive against eager
bit for bit. The exit status is 0 whatever the verdict; only a crash makes it non-zero.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent / "zoo")]

import torch
import transformers
from cases import Case
from catalog import Target, targets
from inputs import (
    MAX_SIDE,
    MULTIMODAL,
    fit_audio_streams,
    fit_boundary_tokens,
    fit_channels,
    fit_codebooks,
    fit_decoder_channels,
    fit_features_channel,
    fit_features_width,
    fit_images,
    fit_length,
    fit_modality_tokens,
    fit_padded_patches,
    fit_patch_images,
    fit_semantic_frames,
    fit_stacked_frames,
    fit_token_labels,
    fit_token_tiles,
    larger_images,
    make_batch,
    time_major,
)
from neuron_helpers import first_line, quiet_transformers, use_in_process_compiles
from shrink import mrope_sections, shrink, with_rope_sections
from tensors import floating_tensors
from torch import nn
from training import AOT_EAGER, Record, run_mode
from traits import traits
from verdict import against_cpu, bits, compiled_verdict

STEPS = 3
MODEL_SEED = 1234
NEURON_MODES = ("eager", "adaptive", "compiled")
TRACE_LINES = 12
FIT_TRIES = 6
BATCH_NORM_VALUES = 16  # the fewest values per channel a BatchNorm of a swept model normalises
# A conv front-end (or a codec's own check) that wants (batch, 1, samples)
ONE_CHANNEL = ("to have 1 channels", "Audio must be mono")


class Trained(nn.Module):
    """The model, returning {"loss", "output"}: its own loss where its head computes one, else
    the mean square of every floating output that depends on the parameters."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, **batch: Any) -> dict[str, Any]:
        """One forward of the model and its loss."""
        output = self.model(**batch)
        loss = output.get("loss") if isinstance(output, Mapping) else None
        if loss is None:
            found = floating_tensors(output, "output")
            grad = torch.is_grad_enabled()  # (an evaluation forward: every output counts)
            terms = [
                t.float().square().mean() for t in found.values() if t.requires_grad or not grad
            ]
            if not terms:
                raise RuntimeError("no floating output of the model depends on its parameters")
            loss = torch.stack(terms).sum()
        if loss.dim():  # (a codec's loss per item)
            loss = loss.mean()
        return {"loss": loss, "output": output}


def find(key: str) -> Target:
    """The target named TYPE:HEAD (or TYPE: its primary target)."""
    for target in targets(all_heads=True):
        if key in (target.key, target.model_type):
            return target
    raise SystemExit(f"unknown sweep target {key!r}: see `tests/sweep/sweep.py --list`")


def build(target: Target) -> tuple[nn.Module, dict[str, Any], Any]:
    """The seeded model (wrapped with its loss), its batch and its config, fitted to each
    other by trial forwards on the CPU: a multimodal model's text gets as many image (audio)
    tokens as its features fill, and a multimodal rotary embedding's sections are scaled to
    the small head when the model says they do not add up; log-mel features go time-major
    (frames, bins) where the model does not take them bins-first as Whisper does, and audio
    gets the length (or the frame width) the model says it needs."""
    config_class = getattr(transformers, target.model_class).config_class
    config = _config(config_class, target.model_type)
    model = _seeded(target, config)
    batch = make_batch(model, target.head, config)
    transposed = False
    for _ in range(FIT_TRIES):
        error = _trial(model, batch)
        fitted = None
        if error is not None:
            fitted = (
                fit_modality_tokens(model, batch, config, error)
                or fit_boundary_tokens(config, batch, error)
                or fit_length(batch, error)
                or fit_features_width(batch, error)
                or fit_features_channel(batch, error)
                or fit_semantic_frames(batch, error)
                or fit_stacked_frames(config, batch, error)
                or fit_patch_images(config, batch, error)
                or fit_padded_patches(batch, error)
                or fit_token_tiles(config, batch, error)
                or fit_images(batch, error)
                or fit_codebooks(config, batch, error)
                or fit_channels(batch, error)
                or fit_audio_streams(config, batch, error)
                or fit_decoder_channels(config, batch, error)
                or fit_token_labels(batch, error)
            )
        sections = None if error is None else mrope_sections(error)
        if fitted is not None:
            batch = fitted
        elif error is not None and _waveform(batch) and any(m in str(error) for m in ONE_CHANNEL):
            batch = dict(batch, input_values=batch["input_values"].unsqueeze(1))  # (b, 1, samples)
        elif error is not None and "input_features" in batch and not transposed:
            batch = time_major(batch)
            transposed = True
        elif sections is not None:
            extra = with_rope_sections(config, sections)
            config = shrink(config_class, target.model_type, extra)
            model = _seeded(target, config)
        else:
            break
    while _few_values_normalised(model, batch) and batch["pixel_values"].shape[-1] < MAX_SIDE:
        larger = larger_images(batch)
        if _trial(model, larger) is not None:
            break  # (a model of one image size: GroupViT's)
        batch = larger
    if _reads_images(model) and "pixel_values" not in batch and _trial(model, batch) is not None:
        pictured = make_batch(model, target.head, config, images=True)
        if _trial(model, pictured) is None:  # (a captioner's text alone fails: GIT's loss)
            batch = pictured
    if target.head in MULTIMODAL and "pixel_values" in batch and _trial(model, batch) is not None:
        text = make_batch(model, target.head, config, text_only=True)
        if _trial(model, text) is None:  # (images that cannot be fitted: the text path alone)
            batch = text
    # A model fresh from its seed: the trials ran it, which may have left state that moving
    # it does not move (Mimi caches its codebook as a plain attribute on first use) or
    # changed its BatchNorm statistics.
    return Trained(_seeded(target, config)), batch, config


def _config(config_class: type, model_type: str) -> Any:
    """The shrunk config; where the config's own checks say a multimodal rotary embedding's
    sections do not add up to the small head, with sections that do."""
    try:
        return shrink(config_class, model_type)
    except Exception as e:  # (strict config validation errors are not ValueErrors)
        sections = mrope_sections(e)
        if sections is None:
            raise
        probe = config_class()
        return shrink(config_class, model_type, with_rope_sections(probe, sections))


def _few_values_normalised(model: nn.Module, batch: dict[str, Any]) -> bool:
    """Whether a BatchNorm of the model normalises fewer than BATCH_NORM_VALUES values per
    channel, on images the batch could have larger. Batch statistics of a few values are
    ill-conditioned (two values normalise to -1 and 1 whatever their difference, so their
    gradient is the inverse of it): an image too small for the network's depth, which
    checkpoints never meet at 224 pixels and more."""
    pixels = batch.get("pixel_values")
    if not isinstance(pixels, torch.Tensor) or pixels.dim() != 4:
        return False
    counts: list[int] = []

    def count(module: nn.Module, args: tuple[Any, ...]) -> None:
        x = args[0]
        counts.append(x.numel() // max(1, x.shape[1]))

    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    hooks = [m.register_forward_pre_hook(count) for m in norms]
    try:
        _trial(model, batch)
    finally:
        for hook in hooks:
            hook.remove()
    return bool(counts) and min(counts) < BATCH_NORM_VALUES


def _reads_images(model: nn.Module) -> bool:
    """Whether the model's forward takes images (which a text head leaves optional)."""
    return "pixel_values" in inspect.signature(model.forward).parameters


def _waveform(batch: dict[str, Any]) -> bool:
    """A batch of (batch, samples) waveforms."""
    values = batch.get("input_values")
    return isinstance(values, torch.Tensor) and values.dim() == 2


def _trial(model: nn.Module, batch: dict[str, Any]) -> Exception | None:
    """The error of one forward on the CPU without gradients, if it fails."""
    try:
        with torch.no_grad():
            model(**batch)
    except (ValueError, RuntimeError, IndexError) as e:
        return e
    return None


@torch.compiler.disable
def repeatable_seed() -> int:
    """torch.seed() drawn from the seeded CPU generator, not the OS's entropy. Reformer reseeds
    every generator with torch.seed() in each training forward (to replay its dropout in the
    backward), and its LSH attention's random rotations then come from that seed: with the
    OS's entropy no two runs of it, on any device, hash alike, and no mode could be compared
    with another. Seeded from the run's seed, every run draws the same rotations."""
    seed = int(torch.randint(0, 2**62, (), dtype=torch.int64))
    torch.manual_seed(seed)  # (every device's generator, as torch.seed() seeds them)
    return seed


def _seeded(target: Target, config: Any) -> nn.Module:
    """The model, its weights drawn after torch.manual_seed(MODEL_SEED)."""
    torch.manual_seed(MODEL_SEED)
    return getattr(transformers, target.model_class)(config)


def failure(stage: str, error: BaseException) -> dict[str, Any]:
    """A stage's error: its first line and the traceback's last lines."""
    lines = traceback.format_exc().strip().splitlines()
    return {"stage": stage, "error": first_line(error), "trace": "\n".join(lines[-TRACE_LINES:])}


def judged(runs: dict[str, Record]) -> dict[str, Any]:
    """The zoo's verdicts on the neuron runs."""
    cpu = runs["cpu"]
    found: dict[str, Any] = {}
    for mode in NEURON_MODES:
        if mode not in runs:
            continue
        run = runs[mode]
        found[mode] = (
            compiled_verdict(run, cpu, runs.get(AOT_EAGER))
            if mode == "compiled"
            else against_cpu(run, cpu)
        )
        if run.trace:
            found[mode]["trace"] = run.trace
    if "eager" in runs and "adaptive" in runs:
        found["bits"] = bits(runs["adaptive"], runs["eager"])
    return found


def evaluate(target: Target, steps: int, build_only: bool) -> dict[str, Any]:
    """Every stage of one target, as far as it gets."""
    result: dict[str, Any] = {"key": target.key, "class": target.model_class}
    try:
        model, batch, config = build(target)
    except Exception as e:  # noqa: BLE001  (the verdict on this target)
        return result | {"built": False, "failure": failure("build", e)}
    result["params"] = sum(p.numel() for p in model.parameters())
    try:
        result["traits"] = traits(model, config, batch, target.head)
    except Exception as e:  # noqa: BLE001  (traits are a description: the runs go on without)
        result["traits"], result["traits_error"] = [], first_line(e)
    case = Case(target.key, "nn", lambda: model, lambda: batch)
    runs = {"cpu": run_mode(case, model, batch, "cpu", steps)}
    if runs["cpu"].error:
        trace = {"stage": "cpu", "error": runs["cpu"].error, "trace": runs["cpu"].trace}
        return result | {"built": False, "failure": trace}
    result["built"] = True
    if build_only:
        return result
    for mode in NEURON_MODES:
        runs[mode] = run_mode(case, model, batch, mode, steps)
    if any(not against_cpu(runs[m], runs["cpu"])["passed"] for m in NEURON_MODES):
        # PyTorch's own compiled graphs on the CPU: compiled mode's reference where CPU eager
        # is out of their tolerance too, and for every mode a measure of how well-conditioned
        # the model is (how far two correct CPU computations of it fall apart), or whether
        # PyTorch's torch.compile fails on it as well.
        runs[AOT_EAGER] = run_mode(case, model, batch, AOT_EAGER, steps)
        aot = runs[AOT_EAGER]
        result["aot_eager_vs_cpu"] = {
            "error": aot.error,
            "worst_ratio": None if aot.error else against_cpu(aot, runs["cpu"])["worst_ratio"],
        }
    result["mode_seconds"] = {mode: round(run.seconds, 2) for mode, run in runs.items()}
    return result | judged(runs)


def main(argv: Sequence[str]) -> int:
    """Prints the verdict on one target as a JSON line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("target", help="TYPE:HEAD or TYPE (its primary head)")
    parser.add_argument("--steps", type=int, default=STEPS, help="SGD steps per mode")
    parser.add_argument("--build-only", action="store_true", help="build and train on CPU only")
    args = parser.parse_args(argv)
    use_in_process_compiles()
    quiet_transformers()
    torch.seed = torch.random.seed = repeatable_seed  # type: ignore[assignment]
    start = time.perf_counter()
    result = evaluate(find(args.target), args.steps, args.build_only)
    result["worker_seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
