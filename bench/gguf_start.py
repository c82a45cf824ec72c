"""Start-up with ``--model FILE.gguf``: the first start converts, later starts load from the store.

Each start is a fresh process that times, with ``time.monotonic_ns()`` after its imports,
``resolve_llm_dir`` (hash or hash record, conversion or store hit) and the whole
``load_llm`` (PyTorch, CPU, fp32: resolve + config + tokenizer + weights). Prints a table
and writes JSON::

    python -m bench.gguf_start --model model.gguf --json out.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def one_start(model: str, store_dir: Path, threads: int) -> dict[str, object]:
    """Resolve and load once in this process; the timings and the progress stages seen."""
    t_import = time.monotonic_ns()
    import torch
    import transformers  # the modules a load imports lazily, timed apart: the same for any model
    from transformers import AutoTokenizer  # noqa: F401

    import engines.torch_backend  # noqa: F401
    import store.gguf  # noqa: F401
    from assistant.config import DecoderSettings, ModelSettings
    from assistant.stages.llm import load_llm, resolve_llm_dir

    transformers.logging.set_verbosity_error()
    torch.set_num_threads(threads)
    imports_ms = (time.monotonic_ns() - t_import) / 1e6
    events: list[str] = []
    settings = ModelSettings(store_dir=store_dir, llm=model)
    t0 = time.monotonic_ns()
    folder = resolve_llm_dir(settings, lambda e: events.append(e.stage))
    t1 = time.monotonic_ns()
    decoder_settings = DecoderSettings(backend="pytorch", device="cpu", dtype="fp32", threads=threads)
    decoder, _tokenizer = load_llm(settings, decoder_settings)
    t2 = time.monotonic_ns()
    decoder.close()
    decoder, _tokenizer = load_llm(settings, decoder_settings)  # again: without lazy imports
    t3 = time.monotonic_ns()
    decoder.close()
    return {
        "imports_ms": imports_ms,
        "resolve_ms": (t1 - t0) / 1e6,
        "load_llm_ms": (t2 - t1) / 1e6,
        "load_llm_again_ms": (t3 - t2) / 1e6,
        "converted": "convert" in events,
        "store_hit": "cached" in events,
        "folder": str(folder),
    }


def main(argv: list[str] | None = None) -> int:
    """Run ``--starts`` fresh processes on one store; print the table, write the JSON."""
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--model", required=True, help="a GGUF file (or any --model value, to compare)")
    parser.add_argument("--store", type=Path, help="model store (default: a new temporary one)")
    parser.add_argument("--starts", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("--one-start", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    store = args.store or Path(tempfile.mkdtemp(prefix="gguf-store-"))
    if args.one_start:
        print(json.dumps(one_start(args.model, store, args.threads)))
        return 0
    rows = []
    for i in range(args.starts):
        cmd = [sys.executable, "-m", "bench.gguf_start", "--one-start"]
        cmd += ["--model", args.model, "--store", str(store)]
        cmd += ["--threads", str(args.threads)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        rows.append({"start": i + 1, **json.loads(out.stdout.strip().splitlines()[-1])})
    size = Path(args.model).stat().st_size if Path(args.model).is_file() else None
    print(f"--model {args.model} ({f'{size / 1e6:.0f} MB' if size else 'not a file'}), store {store}")
    print(
        "resolve: --model to the converted folder; load_llm: resolve again + config + tokenizer + "
        "weights (+ transformers' lazy imports); again: load_llm once more in the same process"
    )
    head = f"{'start':>5} {'converted':>9} {'store hit':>9} {'imports ms':>10} {'resolve ms':>10}"
    print(f"{head} {'load_llm ms':>11} {'again ms':>8}")
    for r in rows:
        print(
            f"{r['start']:>5} {r['converted']!s:>9} {r['store_hit']!s:>9} {r['imports_ms']:>10.0f} "
            f"{r['resolve_ms']:>10.0f} {r['load_llm_ms']:>11.0f} {r['load_llm_again_ms']:>8.0f}"
        )
    if args.json:
        result = {"model": args.model, "file_bytes": size, "store": str(store), "threads": args.threads}
        args.json.write_text(json.dumps({**result, "starts": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
