"""Streaming sentence splitter: LLM text in, speakable chunks out, as soon as each is complete."""

from __future__ import annotations

import re

from assistant.config.sections import SplitterOptions

TERMINATORS = ".?!…"
CLOSERS = "\"'”’)]}*"  # may follow the punctuation that ends a sentence
SCAN = re.compile(rf"\n|(?<=\s)\d|[{TERMINATORS}]+[{re.escape(CLOSERS)}]*")  # what may end a sentence
OPENERS = "\"'“‘([{*"
NO_BREAK_ABBREVIATIONS = frozenset(
    "mr. mrs. ms. dr. st. mt. prof. sr. jr. e.g. i.e. vs. cf. approx. fig.".split()
)
LIST_MARKER = re.compile(r"(\d{1,2})\.\s")
CLAUSE_END = re.compile(r"[,;:](?=\s)")
PARTIAL_LIST_MARKER = re.compile(r"\d{1,2}\.?")  # what a list marker looks like before its space
WORD = re.compile(r"\S+")
AFTER_WORD = re.compile(r"\s+(\S)")  # a word boundary, confirmed by the next non-space character
# Words a first chunk must not end on: the phrase goes on after them ("going to | the shop").
NO_END_WORDS = frozenset(
    "a an the of to in on at for with from by about into as than "
    "and or but nor if because when while whether although unless until "
    "is are was were be been am do does did has have had can could will would should may might must "
    "my your his her its our their this these those any some every each very i we they he she "
    "i'm it's that's there's here's you're we're they're let's".split()
)
FIRST_CHUNK_EXTRA_WORDS = 3  # how far past ``first_chunk_words`` a cut may move to a word that can end
REFILL_WORDS = 3  # the fewest words a piece cut to refill the voice has
REFILL_RUN_CHARS = 48  # text this long with no word to end on is cut anyway (a run of digits)
MARKDOWN = (
    (re.compile(r"^#{1,6}\s+"), ""),  # header
    (re.compile(r"^[-*+•]\s+"), ""),  # bullet
    (re.compile(r"\[([^\]]*)\]\([^)]*\)"), r"\1"),  # [link](url) -> link
    (re.compile(r"\*+|_{2,}|`+"), ""),  # bold, italic, code
)


class SentenceSplitter:
    """Cuts streamed reply text into speakable sentences as soon as each one is complete.

    A sentence ends at a newline or at ``.``, ``?``, ``!`` or an ellipsis (closing quotes
    and brackets included), but only once the next non-space character shows it is an end:
    "Paris." then " It" splits, "3." then "14" does not. A ``.`` after an abbreviation in
    ``NO_BREAK_ABBREVIATIONS`` or an initial ("J.") never ends one; any other ``.`` (also
    "etc.", "U.S.", "p.m.") ends one unless a lowercase word follows; an ellipsis only before
    an uppercase letter. "1." opening a sentence is a list marker, and the next number
    ("2.") or a "1." after a colon starts a new item. Markdown markers are removed from the
    sentences, and sentences with nothing to say ("---") are dropped. The reply's first chunk
    may end earlier, after its first clause or words, and any piece once the voice is about
    to run dry (:class:`SplitterOptions`).
    """

    def __init__(self, options: SplitterOptions | None = None) -> None:
        self.options = options or SplitterOptions()
        self._buffer = ""
        self._first = True  # the reply's first sentence is still to come

    def push(self, text: str, left_ms: float | None = None) -> list[str]:
        """Add streamed text; return the sentences it completed (often none).

        ``left_ms``: how much of the reply is left to play on the speaker (``None``: not
        known, or not playing in real time). Under ``refill_ms``, with no sentence complete,
        the words so far are cut at the last one a phrase may end on (:meth:`_refill_cut`).
        """
        self._buffer += text
        sentences = self._drain(final=False)
        refill = self.options.refill_ms
        if not sentences and not self._first and left_ms is not None and left_ms < refill:
            self._buffer = self._buffer.lstrip()
            cut = self._refill_cut(self._buffer)
            if cut is not None:
                sentences, self._buffer = _speakable(self._buffer[:cut]), self._buffer[cut:]
        return sentences

    def flush(self) -> list[str]:
        """End of the reply: return the sentences left, and start over."""
        sentences = self._drain(final=True)
        rest, self._buffer = self._buffer, ""
        self._first = True
        return sentences + _speakable(rest)

    def _drain(self, final: bool) -> list[str]:
        sentences: list[str] = []
        while True:
            self._buffer = self._buffer.lstrip()
            cut = self._find_cut(self._buffer, final)
            if cut is None:
                return sentences
            sentences += _speakable(self._buffer[:cut])
            self._buffer = self._buffer[cut:]
            self._first = self._first and not sentences

    def _find_cut(self, text: str, final: bool) -> int | None:
        """Where the first sentence of ``text`` ends; ``None``: not known yet (or not in it).

        ``text`` starts with a non-space. Unless ``final``, an answer is given only when more
        text cannot change it, so streamed and whole replies split the same.
        """
        marker = LIST_MARKER.match(text)
        item = int(marker.group(1)) if marker else None
        early = min(
            (c for c in (self._first_clause_end(text), self._first_words_end(text, marker)) if c is not None),
            default=None,
        )
        for m in SCAN.finditer(text, marker.end() if marker else 0):
            if early is not None and m.start() >= early:
                return early
            if m.start() >= self.options.max_chars:
                break
            if m[0] == "\n":
                return m.start()
            if m[0].isdigit():
                verdict, cut = self._opens_item(text, m.start(), item, final), m.start()
            else:
                verdict, cut = self._ends_sentence(text, m.start(), m.end(), final), m.end()
            if verdict is None or verdict:
                return cut if verdict else None
        if early is not None and early <= self.options.max_chars:
            return early
        return self._forced_cut(text) if len(text) > self.options.max_chars else None

    def _first_clause_end(self, text: str) -> int | None:
        """End of the first clause of the reply's first sentence, if it is long enough."""
        if not self._first or not self.options.first_clause_chars:
            return None
        m = CLAUSE_END.search(text, self.options.first_clause_chars)
        return m.end() if m else None

    def _first_words_end(self, text: str, marker: re.Match[str] | None) -> int | None:
        """End of the reply's first chunk at a word boundary; ``None``: none, or not known yet.

        A boundary counts only once the next non-space character has arrived and is a letter,
        digit or opening bracket, so "France" + "." or "mean ?" is never cut before its
        punctuation (the sentence and clause rules decide there), in streams as in whole text.
        """
        wanted = self.options.first_chunk_words
        if not self._first or not wanted:
            return None
        count = 0
        for word in WORD.finditer(text, marker.end() if marker else 0):
            if not any(c.isalnum() for c in word[0]):
                continue  # "-", "**": no word
            count += 1
            if count < wanted:
                continue
            if count > wanted + FIRST_CHUNK_EXTRA_WORDS:
                return None
            may = _may_end_after(text, word)
            if may is None:
                return None  # the next character has not arrived
            if may:
                return word.end()
        return None

    def _refill_cut(self, text: str) -> int | None:
        """Where to cut ``text`` for the voice about to run dry; ``None``: nowhere yet.

        After the last word a phrase may end on (:func:`_can_end_chunk`) whose next non-space
        character has arrived and starts a word, once there are :data:`REFILL_WORDS` words;
        text of :data:`REFILL_RUN_CHARS` or more with no such word (a run of digits) at its
        last space, or whole.
        """
        cut, count = None, 0
        for word in WORD.finditer(text):
            if not any(c.isalnum() for c in word[0]):
                continue
            count += 1
            may = _may_end_after(text, word)
            if may is None:
                break  # the next character has not arrived
            if may and count >= REFILL_WORDS:
                cut = word.end()
        if cut is None and len(text) >= REFILL_RUN_CHARS:
            space = text.rfind(" ")
            cut = space if space > 0 else len(text)
        return cut

    @staticmethod
    def _ends_sentence(text: str, start: int, end: int, final: bool) -> bool | None:
        """Whether the punctuation ``text[start:end]`` ends a sentence (``None``: need more text)."""
        k = end
        while k < len(text) and text[k].isspace():
            k += 1
        if k == end < len(text):
            return False  # "3.14", "v2.5", "example.com"
        if "\n" in text[end:k]:
            return True
        if k == len(text):  # the next character has not arrived (at the reply's end: one sentence)
            return False if final else None
        following = text[k]
        mark = text[start:end].rstrip(CLOSERS)
        if "?" in mark or "!" in mark:
            return True
        if len(mark) > 1 or mark == "…":
            return following.isupper()  # "Well... I think" splits, "wait... what" does not
        words = text[:start].split()
        word = words[-1].lstrip(OPENERS) if words else ""
        if word.lower() + "." in NO_BREAK_ABBREVIATIONS:
            return False
        if len(word) == 1 and word.isupper() and word not in "AI":
            return False  # an initial: "J. R. R. Tolkien"
        return not following.islower()

    @staticmethod
    def _opens_item(text: str, i: int, item: int | None, final: bool) -> bool | None:
        """Whether the number at ``text[i]`` opens the next list item (``None``: need more text)."""
        before = text[:i].rstrip()
        wanted = item + 1 if item is not None else 1 if before.endswith(":") else None
        if wanted is None:
            return False
        marker = LIST_MARKER.match(text, i)
        if marker:
            return int(marker.group(1)) == wanted
        return None if not final and PARTIAL_LIST_MARKER.fullmatch(text, i) else False

    def _forced_cut(self, text: str) -> int:
        """Cut an over-long sentence at its last comma (if not too early) or space."""
        limit = self.options.max_chars
        window = text[: limit + 1]
        comma = max(window.rfind(", "), window.rfind("; "), window.rfind(": "))
        if comma >= limit // 2:
            return comma + 1
        space = window.rfind(" ")
        return space if space > 0 else limit


def _may_end_after(text: str, word: re.Match[str]) -> bool | None:
    """Whether a chunk may end after ``word`` in ``text`` (``None``: the next character has not arrived).

    Only where the next non-space character starts a word (a letter, digit or opening
    bracket), so "France" + "." or "mean ?" is left to the sentence and clause rules, and only
    on a word :func:`_can_end_chunk` allows.
    """
    after = AFTER_WORD.match(text, word.end())
    if after is None:
        return None
    return (after[1].isalnum() or after[1] in "“‘([{") and _can_end_chunk(word[0])


def _can_end_chunk(word: str) -> bool:
    """Whether a first chunk may end on ``word``: not on a number, "Dr.", "the" or "to"."""
    core = word.rstrip(CLOSERS)
    if core.endswith((",", ";", ":")):  # a comma is a pause anyway
        return core[:-1][-1:].isalnum()
    core = core.lstrip(OPENERS).replace("’", "'")
    if not core[-1:].isalnum() or any(c.isdigit() for c in core):
        return False
    return core.lower() not in NO_END_WORDS


def _speakable(sentence: str) -> list[str]:
    """``sentence`` without markdown and extra whitespace; empty if there is no word in it."""
    text = sentence.strip()
    for pattern, replacement in MARKDOWN:
        text = pattern.sub(replacement, text)
    text = " ".join(text.split())
    return [text] if any(c.isalnum() for c in text) else []
