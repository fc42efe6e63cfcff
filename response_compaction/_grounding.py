"""Grounding: a summary may not name identifiers that are nowhere in what it summarizes. Pure.

For each summary field the caller lists in ``grounded``, every string in it is scanned for
identifiers, and each must occur whole (not inside a longer word) in the canonical exact
bytes or in the profile text;
otherwise the summary is ``ungrounded`` and the ladder moves on. An identifier is:

- a URL (``http://`` or ``https://`` up to whitespace or a closing quote/bracket);
- a quoted name: text between double quotes, backticks or curly quotes, and between single
  quotes standing as quotes (not an apostrophe inside a word), 2 to 80 characters;
- a code or id: a token of letters, digits and ``_ - . : / #`` that holds both a letter and
  a digit (``ERR-1042``, ``u42``, ``a3f9c2``), or a token of 6 or more digits, alone or
  joined by separators (``48213377``, ``2018-08-28``, ``14:22:52.143``). A number with an
  ordinal or unit suffix (``95th``, ``250ms``, ``5MB``) is a measure, not an identifier.

Plain words and short numbers are never checked: counts, averages and prose are a summary's
job (but a computed figure with 6 or more digits, like ``12345.678``, is checked). The
false-positive risk (a good summary rejected): a model that reformats an identifier
(``ERR 1042`` for ``ERR-1042``, a date written another way, changed case, a URL with a
trailing slash added), quotes a paraphrase instead of the data's text, or names something
only the caller's instructions contain. Ground only fields meant to carry names copied from
the data (ids, codes, URLs), not free prose.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from typing import Any

import msgspec

from ._pydantic import plain_hook

__all__ = ["MISSING_COUNTED", "identifiers", "missing_detail", "ungrounded"]

_URL = re.compile(r"https?://[^\s\"'<>`)\]}]+")
_QUOTED = re.compile(
    r"\"([^\"\n]{2,80})\"|`([^`\n]{2,80})`|“([^”\n]{2,80})”|(?<!\w)'([^'\n]{2,80})'(?!\w)"
)
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:/#-]*[A-Za-z0-9]|\d{6,}")
_LETTER = re.compile(r"[A-Za-z]")
_DIGIT = re.compile(r"\d")
_TRAILING = ".,;:!?"
# A number with an ordinal or unit suffix (95th, 250ms, 5MB, 10x) is a measure, not a name.
_MEASURE = re.compile(r"\d+(?:\.\d+)?(?:st|nd|rd|th|ms|s|m|h|d|k|kb|mb|gb|tb|x)", re.IGNORECASE)


def identifiers(text: str) -> Iterator[str]:
    """The identifiers in ``text`` by the rule in the module docstring."""
    for match in _URL.finditer(text):
        yield match.group().rstrip(_TRAILING)
    rest = _URL.sub(" ", text)
    for match in _QUOTED.finditer(rest):
        yield next(g for g in match.groups() if g is not None)
    for match in _TOKEN.finditer(rest):
        token = match.group().rstrip(_TRAILING)
        if not _LETTER.search(token):
            # Digits alone or joined by separators: an id, date, time or version once it
            # holds 6 digits; a shorter number is a count or a measure.
            if sum(c.isdigit() for c in token) >= 6:
                yield token
        elif _LETTER.search(token) and _DIGIT.search(token) and not _MEASURE.fullmatch(token):
            yield token


def ungrounded(summary: Any, fields: Sequence[str], haystacks: Sequence[bytes | memoryview]) -> int:
    """How many identifiers in ``summary``'s ``fields`` occur in none of ``haystacks``.

    Counted up to :data:`MISSING_COUNTED`, each distinct identifier once.

    Fields by their Python names (a Struct's renamed field, a pydantic alias: not as
    encoded); a pydantic model inside is taken as its plain data.
    """
    datas = [h if isinstance(h, bytes) else bytes(h) for h in haystacks]  # find() needs bytes
    checked: set[str] = set()
    missing = 0
    for name in fields:
        value = summary.get(name) if isinstance(summary, dict) else getattr(summary, name, None)
        if value is msgspec.UNSET:  # a field the reply left out: nothing to look for
            continue
        for text in _strings(msgspec.to_builtins(value, enc_hook=plain_hook)):
            for ident in identifiers(text):
                if ident in checked:
                    continue  # each is a scan of the data: once (a reply repeating one 20,000
                checked.add(ident)  # times was 20,000 scans, 86 s on 7 MB)
                if not _occurs(ident, datas):
                    missing += 1
                    if missing >= MISSING_COUNTED:  # ungrounded already: stop scanning
                        return missing
    return missing


def missing_detail(missing: int) -> str:
    """What an ungrounded attempt says: how many identifiers (``10+``: the count stopped)."""
    return f"{missing}{'+' if missing >= MISSING_COUNTED else ''} identifiers not in the data"


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _occurs(ident: str, datas: Sequence[bytes]) -> bool:
    r"""Whether ``ident`` occurs whole, as written or as canonical JSON writes it in a string.

    Whole: not inside a longer word (``ERR-104`` is not in ``ERR-1042``, nor ``acct_4821`` in
    ``acct_48213377``); a JSON escape (``\n``) or a terminal colour code before it is no
    word. Candidates are found with ``find`` (a regex with lookarounds scanned 20 times
    slower) and their edges looked at here.
    """
    raw = ident.encode()
    needles = dict.fromkeys((raw, msgspec.json.encode(ident)[1:-1]))
    for data in datas:
        for needle in needles:
            starts, ends = needle[0] in _WORD, needle[-1] in _WORD  # edges that could run on
            at = data.find(needle)
            while at >= 0:
                end = at + len(needle)
                if (not starts or _no_word_before(data, at)) and (
                    not ends or end == len(data) or data[end] not in _WORD
                ):
                    return True
                at = data.find(needle, at + 1)
    return False


def _no_word_before(data: bytes, at: int) -> bool:
    """Whether no word runs on into ``at`` (a JSON escape or a colour code ends one)."""
    if at == 0 or data[at - 1] not in _WORD:
        return True
    return _ESCAPED.search(data, max(0, at - 16), at) is not None


_WORD = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
#: What may stand right before an identifier though it ends in a letter: a JSON escape of a
#: control character (``\n``, ``\t``) or a terminal colour code (``\u001b[31m``).
_ESCAPED = re.compile(rb"(?:(?<!\\)(?:\\\\)*\\[nrtbf]|\[[0-9;]*m)\Z")
#: Missing identifiers counted before the check stops: one already makes a rung ungrounded.
MISSING_COUNTED = 10
