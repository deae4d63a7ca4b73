"""The sweep's published table (docs/SWEEP.md): one row per target, a summary, the error
classes, and the trait coverage of a representative set chosen from the results."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Any

MODES = ("eager", "adaptive", "compiled")
MESSAGE = 90  # characters of an error kept in its class
REPRESENTATIVE = Path(__file__).with_name("representative.txt")
# The published table: writing it (and only it) chooses the representative set `make zoo` runs
# (a report written elsewhere, a test's, leaves the set alone).
PUBLISHED = Path(__file__).resolve().parents[2] / "docs" / "SWEEP.md"
# Model types that cannot build here whatever the harness does, by transformers' own doing:
# model type -> why (shown in the report beside their error).
CANNOT_BUILD = {
    "tvp": (
        "transformers' TvpVisualInputEmbedding.add_2d_positional_embeddings views its (width, "
        "hidden) column table as (batch, 1, width, hidden): only a batch of one image runs"
    ),
    "wavtokenizer_encoder": (
        "its outputs are integer codes and a mask: no floating output depends on its "
        "parameters, so there is nothing to train"
    ),
    "omdet-turbo": (
        "its text-embedding cache (OmDetTurboLRUCache) keeps step 0's embeddings with their "
        "autograd graph, so the second training step backwards through a freed graph; a cache "
        "of size 0 fails on its own (it pops from an empty cache)"
    ),
    "qwen3_omni_moe": (
        "its model reads shared_expert_intermediate_size from its talker's text config, which "
        "that config class does not define; and it has no forward (generate() only)"
    ),
    "voxtral_realtime_text": (
        "transformers' auto mapping names VoxtralRealtimeTextModel, a class transformers "
        "does not define"
    ),
}


def mode_passed(result: dict[str, Any], mode: str) -> bool:
    """Passed against CPU; adaptive also bit for bit equal to eager."""
    verdict = result.get(mode) or {}
    if mode == "adaptive" and not (result.get("bits") or {}).get("equal"):
        return False
    return bool(verdict.get("passed"))


def all_passed(result: dict[str, Any]) -> bool:
    """Built, and passed in every mode."""
    return bool(result.get("built")) and all(mode_passed(result, m) for m in MODES)


def _normalised(message: str) -> str:
    """An error message with its numbers and quoted names blurred, so that alike errors of
    different models fall in one class."""
    message = re.sub(r"0x[0-9a-f]+", "N", message)
    message = re.sub(r"\d+", "N", message)
    message = re.sub(r"'[^']*'", "'…'", message)
    return message[:MESSAGE]


def error_class(result: dict[str, Any]) -> str:
    """The first failure's stage and normalised message ('' when everything passed)."""
    if "died" in result:
        return f"worker {_normalised(result['died'])}"
    if not result.get("built"):
        failure = result.get("failure", {})
        return f"{failure.get('stage', 'build')}: {_normalised(failure.get('error', '?'))}"
    aot = result.get("aot_eager_vs_cpu") or {}
    for mode in MODES:
        verdict = result.get(mode) or {}
        if verdict.get("error"):
            if mode == "compiled" and aot.get("error"):
                return f"compiled: PyTorch's aot_eager fails on the CPU too ({_normalised(aot['error'])})"
            return f"{mode}: {_normalised(verdict['error'].split(': ', 1)[-1])}"
        if not verdict.get("passed") and verdict:
            worst = f"{mode}: {_kind(verdict.get('worst_tensor'))} beyond tolerance"
            if (aot.get("worst_ratio") or 0) > 1:
                return f"{worst}; ill-conditioned: aot_eager is {aot['worst_ratio']:.0e}x tolerance from CPU eager"
            return worst
    if not (result.get("bits") or {}).get("equal", True):
        return "adaptive != eager"
    return ""


def _kind(name: str | None) -> str:
    """A recorded tensor's kind and the last part of its name (grad/...norm.bias)."""
    if not name:
        return "?"
    kind, _, rest = name.partition("/")
    return f"{kind}/…{rest[-40:]}" if len(rest) > 40 else name


def cell(result: dict[str, Any]) -> str:
    """A short status: 'no build', 'built', or each mode's pass/FAIL."""
    if "died" in result:
        return f"died ({result['died']})"
    if not result.get("built"):
        return "no build"
    if result.get("build_only"):
        return "built"
    return ", ".join(f"{m} {'pass' if mode_passed(result, m) else 'FAIL'}" for m in MODES)


def _percent(n: int, of: int) -> str:
    """'n (p %)'."""
    return f"{n} ({100 * n / of:.1f} %)" if of else f"{n}"


def summary(results: list[dict[str, Any]], total: int | None = None) -> str:
    """How many were attempted (of total, the targets of the run), built, and passed in each
    mode."""
    full = [r for r in results if not r.get("build_only")]
    built = [r for r in full if r.get("built")]
    lines = [f"attempted: {len(full)} model types"]
    if total is not None and total > len(full):
        lines[0] += f" of {total} (the other {total - len(full)} not run yet: the sweep resumes)"
    lines.append(f"built: {_percent(len(built), len(full))}")
    for mode in MODES:
        label = "adaptive (and bit-identical to eager)" if mode == "adaptive" else mode
        passed = sum(mode_passed(r, mode) for r in built)
        lines.append(f"{label}: {_percent(passed, len(built))} of the built pass")
    lines.append(f"all three modes: {_percent(sum(map(all_passed, built)), len(built))} of built")
    classes = [error_class(r) for r in built if not all_passed(r)]
    own = sum("PyTorch's aot_eager fails" in c for c in classes)
    ill = sum("ill-conditioned" in c for c in classes)
    unbuilt = [r for r in full if not r.get("built")]
    libraries = Counter(_missing_library(r) for r in unbuilt if _missing_library(r))
    trackers = sum(_inference_only(r) for r in unbuilt)
    bugs = sum(_model_type(r) in CANNOT_BUILD for r in unbuilt)
    if unbuilt:
        named = ", ".join(f"{lib} {n}" for lib, n in libraries.most_common())
        other = len(unbuilt) - sum(libraries.values()) - trackers - bugs
        lines.append(
            f"of the {len(unbuilt)} not built: {sum(libraries.values())} need a library not "
            f"installed here ({named or '-'}), {trackers} have no training step (a video tracker's "
            f"session, or no forward), {bugs} cannot build by transformers' own doing (the "
            f"reasons below), {other} other"
        )
    lines.append(
        f"of the {len(classes)} built that fail: {own} where PyTorch's torch.compile fails on the "
        f"CPU too, {ill} ill-conditioned (PyTorch's aot_eager itself out of tolerance of CPU eager)"
    )
    return "\n".join(lines)


LIBRARY = re.compile(r"requires the (\w+) library but it was not found")


def _missing_library(result: dict[str, Any]) -> str:
    """The library a target that did not build needs and this machine lacks ('' if none)."""
    found = LIBRARY.search((result.get("failure") or {}).get("error", ""))
    return found.group(1) if found else ""


def _model_type(result: dict[str, Any]) -> str:
    """The target's model type (the key's part before the head)."""
    return str(result["key"]).split(":", 1)[0]


def _unbuilt_reasons(results: list[dict[str, Any]]) -> list[str]:
    """Rows of the targets that did not build: why, where it is known, and their error."""
    rows = []
    for r in sorted(results, key=lambda r: r["key"]):
        if r.get("built") or r.get("build_only"):
            continue
        reason = CANNOT_BUILD.get(_model_type(r)) or (
            f"needs {_missing_library(r)}, not installed here"
            if _missing_library(r)
            else "no training step"
            if _inference_only(r)
            else "not yet handled by the shrinker or the input generator"
        )
        rows.append(f"| {r['key']} | {reason} | {error_class(r).replace('|', '/')} |")
    return rows


def _inference_only(result: dict[str, Any]) -> bool:
    """A target with no training step to run: its forward reads an inference session (SAM 2's
    video trackers), or it has no forward at all (generate() or encode() only)."""
    error = (result.get("failure") or {}).get("error", "")
    return "inference_session" in error or "has no forward" in error


def representative(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A small set of passing targets covering every trait they have (greedy set cover, the
    fewest parameters first among equals)."""
    pool = sorted((r for r in results if all_passed(r)), key=lambda r: r.get("params", 0))
    uncovered = {t for r in pool for t in r.get("traits", [])}
    chosen: list[dict[str, Any]] = []
    while uncovered:
        best = max(pool, key=lambda r: len(uncovered & set(r.get("traits", []))))
        gain = uncovered & set(best.get("traits", []))
        if not gain:
            break
        chosen.append(best)
        uncovered -= gain
    return chosen


def coverage(results: list[dict[str, Any]], chosen: list[dict[str, Any]]) -> list[str]:
    """A table: trait, types having it, of them passing, and the representative that has it."""
    having = Counter(t for r in results if r.get("built") for t in r.get("traits", []))
    passing = Counter(t for r in results if all_passed(r) for t in r.get("traits", []))
    rows = ["| trait | built types | passing | representative |", "|---|---|---|---|"]
    for trait in sorted(having):
        who = next((r["key"] for r in chosen if trait in r.get("traits", [])), "-")
        rows.append(f"| {trait} | {having[trait]} | {passing[trait]} | {who} |")
    return rows


def _row(result: dict[str, Any]) -> str:
    """One table row."""
    built = "yes" if result.get("built") else "no"
    modes = [
        ("pass" if mode_passed(result, m) else "FAIL") if result.get("built") else "-"
        for m in MODES
    ]
    traits = " ".join(t.split(":", 1)[1] for t in result.get("traits", []))
    error = error_class(result).replace("|", "/")
    return (
        f"| {result['key']} | {result.get('class', '-')} | {traits} | {built} | "
        f"{' | '.join(modes)} | {error} |"
    )


def write_report(
    results: list[dict[str, Any]], path: Path | None, label: str, total: int | None = None
) -> str:
    """The summary; with a path, the whole report written there."""
    text = summary(results, total)
    if path is None:
        return text
    classes = Counter(error_class(r) for r in results if error_class(r))
    chosen = representative(results)
    lines = [
        "# The transformers sweep",
        "",
        "Generated by `make sweep` (tests/sweep/sweep.py); do not edit by hand. Every model type",
        "of the installed transformers that has a model class, built offline from a shrunk",
        "config with random weights, trained 3 SGD steps on CPU and on neuron in eager,",
        "adaptive and compiled mode. See docs/validation.md for how to read it.",
        "",
        f"Results: `{label}`.",
        "",
        "## Summary",
        "",
        "```",
        text,
        "```",
        "",
        "## Error classes",
        "",
        "| count | class |",
        "|---|---|",
        *[f"| {n} | {c.replace('|', '/')} |" for c, n in classes.most_common()],
        "",
        "## Targets not built",
        "",
        "| target | why | error class |",
        "|---|---|---|",
        *_unbuilt_reasons(results),
        "",
        f"## Trait coverage of the representative set ({len(chosen)} targets)",
        "",
        *coverage(results, chosen),
        "",
        "## Every target",
        "",
        "| target | class | traits | builds | eager | adaptive | compiled | error class |",
        "|---|---|---|---|---|---|---|---|",
        *[_row(r) for r in sorted(results, key=lambda r: r["key"])],
        "",
    ]
    path.write_text("\n".join(lines))
    if path.resolve() != PUBLISHED:
        return text
    REPRESENTATIVE.write_text(
        "# The sweep's representative set (written by the report; `make zoo` runs it)\n"
        + "".join(f"{r['key']}\n" for r in chosen)
    )
    return text


def representative_keys() -> list[str]:
    """The targets of the representative set the last report chose."""
    if not REPRESENTATIVE.exists():
        return []
    lines = REPRESENTATIVE.read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]
