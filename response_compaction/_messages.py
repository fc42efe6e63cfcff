"""Content-free wording of msgspec's validation and decode errors. Pure: no I/O.

msgspec's messages sometimes quote the offending value (``Invalid enum value 'sk-...'``) or a
key taken from the document (``Object contains unknown field `alice@example.com```), and a
schema's own ``__post_init__`` may say anything. Every message this library builds from a
failed validation goes through :func:`content_free`, which keeps only what the schema and the
shape of the document say: the kind of failure, the expected type or constraint, and the path
(msgspec's paths name struct fields and array indices, never dict keys: those are ``[...]``).

It is an allow-list: a message kept verbatim matches a msgspec template whose blanks are
filled from the schema or with type names and counts. Anything else is reduced to the kind of
failure and the path, so a template this module has never seen cannot leak a value.
"""

from __future__ import annotations

import re

import msgspec

__all__ = ["content_free"]

# msgspec appends the location last: " - at `$.a[0]`" or " - at `key` in `$.a`".
_PATH = re.compile(r" - at (?P<path>(?:`key` in )?`\$[^`]*`)\Z")

# Templates whose every blank comes from the schema, or is a type name or a count.
_KEEP = re.compile(
    r"""
    Expected\ `[^`]+`,\ got\ `[^`]+`
    | Expected\ `[^`]+`\ with\ (?:a|no)\ timezone\ component
    | Expected\ `array`\ of(?:\ at\ least|\ at\ most)?\ length\ (?:[<>]=\ )?\d+(?:\ to\ \d+)?
      (?:,\ got\ \d+)?
    | Expected\ `(?:array|bytes|object|str)`\ of\ length\ [<>]=\ \d+
    | Expected\ `int`(?:\ [<>]=\ -?\d+|\ that's\ a\ multiple\ of\ -?\d+)?
    | Expected\ `float`\ (?:[<>]=?|that's\ a\ multiple\ of)\ [-+0-9.eE]+
    | Expected\ `str`(?:\ matching\ regex\ '.*')?
    | Expected\ a\ hashable\ value,\ got\ `[^`]+`
    | Object\ missing\ required\ field\ `[^`]+`
    | (?:Integer\ value|Number|Duration\ is|Timestamp\ is)\ out\ of\ range
    | Invalid\ (?:RFC3339\ encoded\ (?:date|datetime|time)|UUID(?:\ bytes)?
      |base64\ encoded\ string|decimal\ string|epoch\ timestamp|ISO8601\ duration
      |UTF-8\ encoded\ string)
    | Input\ data\ was\ truncated
    | JSON\ is\ malformed:\ [a-z ',:\]}"]+\ \(byte\ \d+\)
    """,
    re.VERBOSE,
)

# Templates that quote the value or a document key: keep the words, drop the quote.
_REDACT = (
    ("Invalid enum value", "Invalid enum value"),
    ("Invalid value", "Invalid value"),
    ("Object contains unknown field", "Object contains unknown field"),
)


def content_free(exc: msgspec.ValidationError | msgspec.DecodeError) -> str:
    """What failed and where, without any value or key from the document.

    ``Expected `int`, got `str` - at `$.rows[0].id``` is kept as is; ``Invalid enum value
    'secret' - at `$.state``` becomes ``Invalid enum value - at `$.state```; an unknown
    field is named by the path of its object only. A message that matches no known msgspec
    template (a schema's ``__post_init__``, a ``dec_hook``) becomes a generic sentence.
    """
    message = str(exc)
    where = ""
    match = _PATH.search(message)
    if match is not None:
        message = message[: match.start()]
        where = " - at " + match.group("path")
    elif isinstance(exc, msgspec.ValidationError):
        where = " - at `$`"
    return _head(message, exc) + where


def _head(message: str, exc: Exception) -> str:
    if _KEEP.fullmatch(message):
        return message
    for prefix, kept in _REDACT:
        if message.startswith(prefix):
            return kept
    if isinstance(exc, msgspec.ValidationError):
        return "Value was refused by a check of the schema"
    return "JSON is malformed"
