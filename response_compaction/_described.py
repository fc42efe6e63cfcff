"""Schemas named by reference, so a verification worker can import them: ``list[pkg.mod.Row]``.

Pure. A schema that cannot be named that way (defined in ``__main__`` or in a function, made
by a factory under a name that is another object's, or a shape the description does not
cover) has no description, and is verified in the caller: a worker verifying against what
the name imports there would check the bytes against another schema.
"""

from __future__ import annotations

import functools
import importlib
import operator
import sys
import types
import typing
from typing import Any

__all__ = ["describe", "resolve"]


def describe(schema: Any) -> Any:
    """A description of ``schema`` by reference, or None if there is none."""
    if schema is Any:
        return ["any"]
    if schema is None or schema is type(None):
        return ["none"]
    if schema is Ellipsis:
        return ["ellipsis"]  # tuple[int, ...]
    origin = typing.get_origin(schema)
    if origin is not None:
        args = typing.get_args(schema)
        if origin is typing.Literal:
            ok = all(type(a) in (str, int, bool) or a is None for a in args)
            return ["literal", list(args)] if ok else None
        if origin is typing.Annotated:
            return None  # constraints live in metadata objects: verified in the caller
        described = [describe(a) for a in args]
        if any(d is None for d in described):
            return None
        if origin in (typing.Union, types.UnionType):
            return ["union", described]
        head = describe(origin)
        return None if head is None else ["generic", head, described]
    module = getattr(schema, "__module__", None)
    qualname = getattr(schema, "__qualname__", None)
    if not isinstance(schema, type) or not module or not qualname:
        return None
    if module == "__main__" or "<locals>" in qualname:
        return None  # the caller's main module is never imported by a worker
    if _named(module, qualname) is not schema:
        return None  # made by a factory (defstruct, create_model) or reloaded since
    return ["ref", module, qualname]


def _named(module: str, qualname: str) -> Any:
    """What ``module.qualname`` is in this process now (None if nothing)."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj


def resolve(description: Any) -> Any:
    """The schema a :func:`describe` description names (in the worker)."""
    tag = description[0]
    if tag == "any":
        return Any
    if tag == "none":
        return None
    if tag == "ellipsis":
        return Ellipsis
    if tag == "literal":
        return typing.Literal[tuple(description[1])]
    if tag == "union":
        return functools.reduce(operator.or_, [resolve(d) for d in description[1]])
    if tag == "generic":
        return resolve(description[1])[tuple(resolve(d) for d in description[2])]
    if tag == "ref" and description[1] != "__main__":
        obj: Any = importlib.import_module(description[1])
        for part in description[2].split("."):
            obj = getattr(obj, part)
        if describe(obj) != description:
            raise LookupError("the name resolves to another object")
        return obj
    raise LookupError("unknown schema description")
