#!/usr/bin/env python3
"""The engine pipeline of the source article's CI/CD: export -> build -> verify -> publish.

    scripts/build_engine.py --target sm89                     # TensorRT-RTX, on any machine
    scripts/build_engine.py --flavour tensorrt --triton repo  # on the GPU, plus a Triton repo
    scripts/build_engine.py --profile-from turns.jsonl --require-verified

1. export: the ONNX graph of the configured model (cached beside it); for bf16 and int8 the
   build step exports the graph its TensorRT version needs (or refuses first).
2. build: the engine into the store's engine cache (a cache hit when nothing changed).
3. verify: the accuracy gate against PyTorch fp32. Where the engine can run (a supported GPU)
   the engine itself is judged and its record marked; elsewhere the ONNX graph it was built
   from is judged on ONNX Runtime and the engine stays "not verified" (said so in the output).
   ``--require-verified`` fails the pipeline unless the engine itself passed.
4. publish: the engine is in the cache (what ``--backend tensorrt*`` loads); ``--publish DIR``
   copies its folder there too, ``--triton DIR`` writes a Triton model repository.
Settings come from the same file, variables and flags as ``assistant`` (``--store``, ``--model``).
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from assistant.config import load_settings  # the installed package (scripts/setup.sh installs it editable)
from assistant.stages.llm import engine_cache_dir, resolve_llm_dir
from engines.tensorrt.cache import read_record

ROOT = Path(__file__).resolve().parent.parent


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "assistant", *args]
    print("$ assistant " + " ".join(args), flush=True)
    done = subprocess.run(command, cwd=ROOT, text=True, stdout=subprocess.PIPE)
    print(done.stdout, end="", flush=True)
    return done


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--store", help="model store (default ~/.cache/assistant)")
    parser.add_argument("--model", help="LLM: store name or folder")
    parser.add_argument("--flavour", choices=["auto", "tensorrt", "tensorrt-rtx"])
    parser.add_argument("--precision", choices=["fp16", "bf16", "fp32", "int8"])
    parser.add_argument("--target", help="TensorRT-RTX targets, e.g. sm89 or sm86,sm120")
    parser.add_argument("--profile-from", type=Path, metavar="JSONL", help="derive profiles from a turns log")
    parser.add_argument(
        "--require-verified", action="store_true", help="fail unless the engine itself passed"
    )
    parser.add_argument("--publish", type=Path, metavar="DIR", help="copy the engine folder here")
    parser.add_argument("--triton", type=Path, metavar="DIR", help="write a Triton model repository here")
    args = parser.parse_args()
    common: list[str] = []
    for flag, value in (("--store", args.store), ("--model", args.model)):
        if value:
            common += [flag, value]
    build_flags = list(common)
    for flag, value in (
        ("--flavour", args.flavour),
        ("--precision", args.precision),
        ("--target", args.target),
    ):
        if value:
            build_flags += [flag, value]
    # bf16 and int8 graphs depend on the TensorRT version: the build exports (or refuses) itself.
    if args.precision in (None, "fp16", "fp32"):
        if cli("engine", "export", *common, "--dtype", args.precision or "fp16").returncode:
            return 1
    extra = ["--profile-from", str(args.profile_from)] if args.profile_from else []
    built = cli("engine", "build", *build_flags, *extra)
    if built.returncode:
        return 1
    engine_path = Path(built.stdout.split(": ", 1)[1].split(" (", 1)[0])
    verified = cli("engine", "verify", *build_flags)
    if verified.returncode == 2:  # the engine cannot run here: judge the graph it came from
        print("the engine cannot run on this machine; verifying its ONNX graph on ONNX Runtime instead")
        verified = cli("engine", "verify", *build_flags, "--onnxruntime")
        if verified.returncode == 0 and args.require_verified:
            print("FAILED: --require-verified, and the engine itself could not be verified here")
            return 1
    if verified.returncode:
        print("FAILED: the accuracy gate refused it; not published")
        return 1
    settings = load_settings(overrides={"models.store_dir": args.store, "models.llm": args.model})
    record = read_record(engine_path.parent)
    print(f"in the engine cache: {engine_path} ({engine_cache_dir(settings.models)})")
    if args.publish:
        target = args.publish / engine_path.parent.name
        shutil.copytree(engine_path.parent, target, dirs_exist_ok=True)
        print(f"published: {target}")
    if args.triton:
        import json

        from engines.tensorrt.triton import TritonExportError, write_repository

        model_dir = resolve_llm_dir(settings.models)
        metadata = json.loads((Path(record["onnx"]["path"]).parent / "export.json").read_text())["metadata"]
        try:
            folder = write_repository(args.triton, model_dir.name, engine_path, record, metadata)
        except TritonExportError as e:
            print(f"error: no Triton repository written: {e}")
            return 1
        print(f"triton model repository: {folder}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
