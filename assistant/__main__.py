"""Command line: ``assistant [chat] | models fetch|list``; builds settings, then the stages."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from assistant.config import ConfigError, Settings, load_settings
from models.store import BUNDLED, FetchError, ModelStore
from models.weights import CorruptModel, ModelNotFound

logger = logging.getLogger("assistant")


def _common(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: an unset flag leaves no attribute, so `assistant --model X chat` keeps X.
    parser.argument_default = argparse.SUPPRESS
    g = parser.add_argument_group("settings (override the config file and ASSISTANT_* variables)")
    g.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="TOML settings file (default ~/.config/assistant/config.toml)",
    )
    g.add_argument(
        "--store", dest="models.store_dir", metavar="DIR", help="model store (default ~/.cache/assistant)"
    )
    g.add_argument(
        "--model",
        dest="models.llm",
        metavar="NAME|DIR|HUB_ID",
        help="LLM: store name, local HF folder or hub id",
    )
    g.add_argument("--backend", dest="decoder.backend", choices=["pytorch"], help="decoder backend")
    g.add_argument("--device", dest="decoder.device", metavar="DEVICE", help="auto, cpu, cuda, cuda:N")
    g.add_argument("--dtype", dest="decoder.dtype", choices=["auto", "fp32", "fp16", "bf16"])
    g.add_argument(
        "--context-tokens",
        dest="decoder.context_tokens",
        type=int,
        metavar="N",
        help="KV cache size in tokens",
    )
    g.add_argument("--threads", dest="decoder.threads", type=int, metavar="N", help="CPU threads (0 = auto)")
    g.add_argument("--max-new-tokens", dest="generation.max_new_tokens", type=int, metavar="N")
    g.add_argument("--temperature", dest="generation.temperature", type=float, metavar="T", help="0 = greedy")
    g.add_argument("--top-k", dest="generation.top_k", type=int, metavar="K")
    g.add_argument("--top-p", dest="generation.top_p", type=float, metavar="P")
    g.add_argument("--repetition-penalty", dest="generation.repetition_penalty", type=float, metavar="X")
    g.add_argument("--seed", dest="generation.seed", type=int, metavar="N")
    g.add_argument("--system-prompt", dest="dialogue.system_prompt", metavar="TEXT")
    parser.add_argument("-v", "--verbose", action="count", help="log more (-vv for debug)")


def build_parser() -> argparse.ArgumentParser:
    """The argparse tree for every subcommand."""
    parser = argparse.ArgumentParser(
        prog="assistant",
        description="Local low-latency voice assistant. Without a subcommand: text chat.",
    )
    _common(parser)
    sub = parser.add_subparsers(dest="command")
    chat = sub.add_parser("chat", help="text chat on stdin/stdout with a latency line per turn")
    _common(chat)
    models = sub.add_parser("models", help="bundled models: fetch, list")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    fetch = models_sub.add_parser("fetch", help="download and convert the bundled models")
    fetch.add_argument("names", nargs="*", help=f"default: all ({', '.join(BUNDLED)})")
    fetch.add_argument("--force", action="store_true", help="fetch again even when present")
    _common(fetch)
    listing = models_sub.add_parser("list", help="models in the store with sizes")
    _common(listing)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    overrides = {k: v for k, v in vars(args).items() if "." in k}
    return load_settings(getattr(args, "config", None), overrides=overrides)


def _models(args: argparse.Namespace, settings: Settings) -> int:
    store = ModelStore(settings.models.store_dir)
    if args.models_command == "fetch":
        for name in args.names or list(BUNDLED):
            store.fetch(name, force=args.force)
        return 0
    stored = store.list()
    if not stored:
        print(f"no models in {store.models_dir}; run 'assistant models fetch'")
    for m in stored:
        print(f"{m.name:28} {m.kind:4} {m.size_bytes / 1e6:8.1f} MB  {m.source:28} {m.path}")
    missing = [n for n in BUNDLED if not store.is_present(n)]
    if missing:
        print(f"bundled but not fetched: {', '.join(missing)}")
    return 0


def _chat(settings: Settings) -> int:
    from assistant.chat import run_chat
    from assistant.dialogue import Dialogue
    from assistant.llm import load_llm

    decoder, tokenizer = load_llm(settings.models, settings.decoder)
    dialogue = Dialogue(decoder, tokenizer, settings.dialogue.system_prompt, settings.generation.options())
    return run_chat(dialogue)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``assistant`` console script."""
    args = build_parser().parse_args(argv)
    level = [logging.WARNING, logging.INFO, logging.DEBUG][min(getattr(args, "verbose", 0), 2)]
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = _settings(args)
        if args.command == "models":
            return _models(args, settings)
        return _chat(settings)
    except (ConfigError, ModelNotFound, CorruptModel, FetchError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
