"""Word error rate of transcripts against their texts, after a small English normalizer.

The normalizer lowercases, spells numbers out ("25" -> "twenty five", "3rd" -> "third",
"20%" -> "twenty percent"), so "ten minutes" and "10 minutes" count as the same words, and
drops punctuation. The edit distance is jiwer's (``pip install jiwer``: a development
dependency, only the benchmarks use it).
"""

from __future__ import annotations

import re

ONES = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen"
).split()
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
SCALES = ((10**9, "billion"), (10**6, "million"), (1000, "thousand"), (100, "hundred"))
ORDINALS = {"one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth"}
ORDINALS |= {"nine": "ninth", "twelve": "twelfth"}
WORDS = {"dr": "doctor", "mr": "mister", "mrs": "missus", "ok": "okay", "o'clock": "oclock"}


def spoken(n: int) -> str:
    """``21`` -> ``twenty one``, ``1205`` -> ``one thousand two hundred five`` (no "and")."""
    if n < 20:
        return ONES[n]
    if n < 100:
        return TENS[n // 10] + ("" if n % 10 == 0 else " " + ONES[n % 10])
    scale, name = next((s, w) for s, w in SCALES if n >= s)
    rest = n % scale
    return f"{spoken(n // scale)} {name}" + ("" if rest == 0 else " " + spoken(rest))


def _ordinal(words: str) -> str:
    head, _, last = words.rpartition(" ")
    last = ORDINALS.get(last) or (last[:-1] + "ieth" if last.endswith("y") else last + "th")
    return f"{head} {last}".strip()


def _number(match: re.Match[str]) -> str:
    digits, suffix = match.group(1), match.group(2)
    if len(digits) > 1 and digits.startswith("0"):  # "0199" is said digit by digit
        return " ".join(ONES[int(d)] for d in digits)
    words = spoken(int(digits))
    return _ordinal(words) if suffix else words


def normalize(text: str) -> str:
    """Lower case, numbers spelled out, no punctuation, single spaces."""
    text = text.lower().replace("-", " ")
    text = re.sub(r"(?<=\d),(?=\d{3})", "", text)  # 8,849 -> 8849
    text = re.sub(r"(\d)\.(\d)", r"\1 point \2", text)
    text = re.sub(r"\$(\d+)", r"\1 dollars", text)
    text = text.replace("%", " percent")
    text = re.sub(r"(\d+)(st|nd|rd|th)?\b", lambda m: f" {_number(m)} ", text)
    words = re.findall(r"[a-z']+", text)
    return " ".join(WORDS.get(w, w).replace("'", "") for w in words)


def word_error_rate(references: list[str], hypotheses: list[str]) -> float:
    """Corpus WER in percent: all edits over all reference words, after :func:`normalize`.

    Raises:
        SystemExit: jiwer is not installed (the message names the fix).
    """
    try:
        import jiwer
    except ImportError as e:
        raise SystemExit(
            "the ASR benchmark needs jiwer: pip install jiwer (or pip install -e '.[dev]')"
        ) from e
    refs = [normalize(r) for r in references]
    hyps = [normalize(h) for h in hypotheses]
    return 100.0 * float(jiwer.wer(refs, hyps))
