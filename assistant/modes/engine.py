"""``assistant engine export | build | profile | list | clear | verify``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path

from assistant.config import Settings
from assistant.stages.llm import engine_cache_dir, onnx_dtype, resolve_llm_config
from engines.tensorrt.options import FLAVOURS, PRECISIONS, EngineOptions
from store.records import repair_hints

SUPPRESS = argparse.SUPPRESS


def add_engine_parsers(
    sub: argparse._SubParsersAction, common: Callable[[argparse.ArgumentParser], None]
) -> None:
    """The ``engine`` subcommand tree (``common`` adds the shared settings flags)."""
    engine = sub.add_parser("engine", help="decoder engines: ONNX export, TensorRT build, cache, verify")
    engine_sub = engine.add_subparsers(dest="engine_command", required=True)
    export = engine_sub.add_parser(
        "export", help="export the decoder to ONNX (--dtype fp32|fp16), cached beside the model"
    )
    export.add_argument("--force", action="store_true", help="export again even when cached")
    common(export)
    build = engine_sub.add_parser("build", help="build (or reuse) the TensorRT engine of the decoder")
    _build_flags(build)
    build.add_argument("--force", action="store_true", help="build again even when cached")
    build.add_argument(
        "--profile-from",
        type=Path,
        metavar="JSONL",
        default=SUPPRESS,
        help="derive profiles from a turns log",
    )
    build.add_argument("--percentile", type=float, default=99.0, help="profile max percentile (default 99)")
    common(build)
    profile = engine_sub.add_parser("profile", help="optimization profiles from recorded turns (P95/P99)")
    profile.add_argument(
        "--from", dest="log", type=Path, required=True, metavar="JSONL", help="'assistant run --log' file"
    )
    profile.add_argument(
        "--percentile", type=float, default=99.0, help="percentile for the maxima (default 99)"
    )
    common(profile)
    listing = engine_sub.add_parser(
        "list", help="cached engines with sizes, what each was built for and its accuracy gate result"
    )
    common(listing)
    clear = engine_sub.add_parser(
        "clear",
        help="delete cached engines (all, or only unusable ones; never one being built) and what "
        "interrupted builds and exports left",
    )
    clear.add_argument("--broken", action="store_true", help="only entries that failed their check")
    clear.add_argument("--caches", action="store_true", help="also the timing/runtime/calibration caches")
    common(clear)
    verify = engine_sub.add_parser(
        "verify", help="accuracy gate: the engine against PyTorch fp32 (the [gate] thresholds)"
    )
    _build_flags(verify)
    verify.add_argument("--max-new-tokens-per-reply", dest="verify_tokens", type=int, default=32, metavar="N")
    verify.add_argument(
        "--onnxruntime",
        action="store_true",
        help="check the ONNX export on ONNX Runtime instead (no engine is marked)",
    )
    common(verify)


def _build_flags(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("engine (override the [engine] settings)")
    g.add_argument("--flavour", dest="engine.flavour", choices=["auto", *FLAVOURS], default=SUPPRESS)
    g.add_argument(
        "--precision",
        dest="engine.precision",
        choices=PRECISIONS,
        default=SUPPRESS,
        help="fp16 (default), bf16 or fp32; int8 only with full TensorRT 10.x (calibrated)",
    )
    g.add_argument(
        "--target",
        dest="engine.targets",
        metavar="SM",
        default=SUPPRESS,
        help="RTX targets: sm89 or sm86,sm120",
    )
    g.add_argument("--workspace-mib", dest="engine.workspace_mib", type=int, metavar="MIB", default=SUPPRESS)


def _flavour(settings: Settings) -> str:
    from engines.tensorrt.flavour import resolve_flavour_name

    requested = settings.engine.flavour
    if requested == "auto" and settings.decoder.backend in FLAVOURS:
        requested = settings.decoder.backend
    return resolve_flavour_name(requested)


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def run_engine(args: argparse.Namespace, settings: Settings) -> int:
    """Run one ``engine`` subcommand; returns the exit status."""
    command = args.engine_command
    if command == "profile":
        return _profile(args, settings)
    if command == "list":
        return _list(settings)
    if command == "clear":
        return _clear(args, settings)
    # export, build and verify load the model: name the fix of a damaged one (models/ does not)
    model_dir = resolve_llm_config(settings.models).path  # a config that does not fit its weights: named
    with repair_hints(model_dir):
        if command == "export":
            return _export(args, settings, model_dir)
        if command == "verify":
            return _verify(args, settings, model_dir)
        return _build(args, settings, model_dir)


def _export(args: argparse.Namespace, settings: Settings, model_dir: Path) -> int:
    from engines.onnx_export import ExportOptions, export_decoder

    options = ExportOptions(dtype=onnx_dtype(settings.decoder.dtype))
    result = export_decoder(model_dir, options, force=args.force)
    state = "cache hit" if result.cache_hit else f"exported in {result.export_s:.1f} s"
    size_mb = result.size_bytes / 1e6
    print(f"{state}: {result.path} ({options.dtype}, opset {options.opset}, {size_mb:.0f} MB)")
    return 0


def _engine_options(args: argparse.Namespace, settings: Settings, model_dir: Path) -> EngineOptions:
    from engines.tensorrt.profiles import profile_from_log
    from models.config import DecoderConfig

    options = settings.engine
    log = getattr(args, "profile_from", None)
    if log is not None:
        limit = DecoderConfig.from_dir(model_dir).max_position_embeddings
        derived = profile_from_log(log, options, percentile=args.percentile, model_max_tokens=limit)
        _say(f"profile from {derived.turns} turns of {log}: {derived.toml().splitlines()[1:]}")
        if derived.warning:
            _say(f"warning: {derived.warning}")
        options = derived.options
    return options


def _build(args: argparse.Namespace, settings: Settings, model_dir: Path) -> int:
    from engines.onnx_export import ExportOptions, export_decoder
    from engines.progress import ConsolePrinter
    from engines.tensorrt.builder import build_engine
    from engines.tensorrt.flavour import export_dtype, load_flavour

    options = _engine_options(args, settings, model_dir)
    flavour = load_flavour(_flavour(settings))
    dtype, _ = export_dtype(flavour, options.precision)  # refuses before any export work
    exported = export_decoder(model_dir, ExportOptions(dtype=dtype))
    _say(
        f"onnx: {exported.path} "
        f"({'cached' if exported.cache_hit else f'exported in {exported.export_s:.1f} s'})"
    )
    calibration = None
    if options.precision == "int8":
        from assistant.stages.tokenizer import load_tokenizer
        from engines.tensorrt.calibration import calibration_ids

        calibration = calibration_ids(load_tokenizer(model_dir))
    built = build_engine(
        exported,
        options,
        engine_cache_dir(settings.models),
        flavour_name=flavour.name,
        progress=ConsolePrinter(_say),
        force=args.force,
        calibration_ids=calibration,
    )
    r = built.record
    targets = ",".join(r["targets"])
    what = f"{r['flavour']} {r['version']} {targets} {r['precision']}, {built.size_bytes / 1e6:.0f} MB"
    state = "cache hit" if built.cache_hit else f"built in {built.build_s:.1f} s"
    print(f"{state}: {built.path} ({what})")
    return 0


def _profile(args: argparse.Namespace, settings: Settings) -> int:
    from engines.tensorrt.profiles import profile_from_log

    derived = profile_from_log(args.log, settings.engine, percentile=args.percentile)
    p, c = derived.prefill, derived.context
    print(f"{derived.turns} turns ({derived.skipped} without a prompt skipped) from {args.log}")
    print(f"prefilled tokens: p50 {p.p50:.0f}  p95 {p.p95:.0f}  p99 {p.p99:.0f}  max {p.max:.0f}")
    print(f"context tokens:   p50 {c.p50:.0f}  p95 {c.p95:.0f}  p99 {c.p99:.0f}  max {c.max:.0f}")
    if derived.warning:
        print(f"warning: {derived.warning}")
    print(f"# max at P{derived.percentile:g}; paste into the settings file, or build with --profile-from")
    print(derived.toml(), end="")
    return 0


def _list(settings: Settings) -> int:
    from engines.tensorrt.cache import list_entries
    from engines.tensorrt.tuning import tuning_caches

    cache_dir = engine_cache_dir(settings.models)
    entries = list_entries(cache_dir)
    if not entries:
        print(f"no engines in {cache_dir}; build one with 'assistant engine build'")
    for e in entries:
        state = f"UNUSABLE: {e.problem}" if e.problem else e.describe()
        print(f"{e.size_bytes / 1e6:8.1f} MB  {e.folder.name}\n             {state}")
    for path in tuning_caches(cache_dir):
        print(f"{path.stat().st_size / 1e6:8.1f} MB  {path.parent.name}/{path.name}")
    total = sum(e.size_bytes for e in entries) + sum(p.stat().st_size for p in tuning_caches(cache_dir))
    print(f"total {total / 1e6:.1f} MB in {cache_dir}")
    return 0


def _clear(args: argparse.Namespace, settings: Settings) -> int:
    from engines.tensorrt.cache import check_entry, clear_entries
    from engines.tensorrt.tuning import tuning_caches
    from store.bundled import ModelStore
    from store.leftovers import sweep_staging

    cache_dir = engine_cache_dir(settings.models)
    if args.broken:
        cleared = clear_entries(cache_dir, keep=lambda e: check_entry(e.folder) is None)
    else:
        cleared = clear_entries(cache_dir)
    freed = sum(e.size_bytes for e in cleared.removed)
    for e in cleared.removed:
        print(f"removed {e.folder.name} ({e.size_bytes / 1e6:.1f} MB)")
    for e, pid in cleared.busy:
        print(f"skipped {e.folder.name}: being built by process {pid}; clear it after the build")
    swept = [*cleared.swept, *_sweep_exports(settings)]
    for path, size_bytes in swept:
        freed += size_bytes
        print(f"removed {path} ({size_bytes / 1e6:.1f} MB), left by an interrupted build or export")
    for path, size_bytes in sweep_staging(ModelStore(settings.models.store_dir).models_dir):
        freed += size_bytes
        print(f"removed {path} ({size_bytes / 1e6:.1f} MB), left by an interrupted fetch or conversion")
    if args.caches:
        for path in tuning_caches(cache_dir):
            freed += path.stat().st_size
            path.unlink()
            print(f"removed {path.name}")
    print(f"freed {freed / 1e6:.1f} MB")
    return 0


def _sweep_exports(settings: Settings) -> list[tuple[Path, int]]:
    """Staging folders killed ONNX exports left beside the configured model (never downloads)."""
    from engines.cache_lock import sweep_staging
    from store.bundled import ModelStore

    store, name = ModelStore(settings.models.store_dir), settings.models.llm
    model_dir = store.path(name) if store.is_present(name) else Path(name).expanduser()
    return sweep_staging(model_dir / "onnx") if model_dir.is_dir() else []


def _verify(args: argparse.Namespace, settings: Settings, model_dir: Path) -> int:
    from assistant.stages.tokenizer import load_tokenizer
    from engines.tensorrt.gate import record_verdict
    from engines.torch_backend import TorchBackendOptions, load_torch_decoder
    from engines.verify import verify_decoder

    tokenizer = load_tokenizer(model_dir)
    engine_path = None
    if args.onnxruntime:
        from engines.onnxruntime_backend import OnnxRuntimeOptions, load_onnxruntime_decoder

        dtype = "fp16" if settings.engine.precision == "fp16" else "fp32"
        candidate = load_onnxruntime_decoder(model_dir, tokenizer, OnnxRuntimeOptions(dtype=dtype))
    else:
        from engines.tensorrt.backend import load_tensorrt_decoder

        flavour = _flavour(settings)
        options = dataclasses.replace(settings.engine, flavour=flavour)
        candidate = load_tensorrt_decoder(
            model_dir, tokenizer, options, engine_cache_dir(settings.models),
            capacity_tokens=settings.decoder.context_tokens, progress=None,
        )  # fmt: skip
        engine_path = getattr(candidate.step, "engine_path", None)
    try:
        reference = load_torch_decoder(model_dir, tokenizer, TorchBackendOptions(device="cpu", dtype="fp32"))
        report = verify_decoder(
            candidate,
            reference,
            tokenizer,
            max_new_tokens=args.verify_tokens,
            thresholds=settings.gate.thresholds(),
            system_prompt=settings.dialogue.system_prompt,
        )
    finally:
        candidate.close()  # frees the engine and saves its runtime cache
    for r in report.results:
        print(
            f"{r.token_agreement:6.1%} agree  err {r.max_logits_rel_err:.2e}  "
            f"rouge-l {r.rouge_l:.3f}  {r.prompt}"
        )
    print(
        f"{report.candidate} vs {report.reference}: token agreement {report.token_agreement:.1%}, "
        f"logits rel. error max {report.max_logits_rel_err:.2e} mean {report.mean_logits_rel_err:.2e}, "
        f"ROUGE-L {report.rouge_l:.3f}"
    )
    if engine_path is not None:  # the start-up gate of `--backend auto` then trusts this verdict
        record_verdict(Path(engine_path).parent, report, "engine verify")
    if not report.passed:
        print(f"REJECTED: {'; '.join(report.failures)}")
        return 1
    print(
        "PASSED" + (f": {engine_path} marked verified" if engine_path else " (ONNX export; no engine marked)")
    )
    return 0
