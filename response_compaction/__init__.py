"""Keep large agent responses exact on disk; hand the agent the value, a summary, or a fallback.

>>> compacted = await response_compact(harness, response, Exact, Summary, options)
>>> compacted.output.kind            # "exact" | "summarized" | "fallback"
>>> await response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)

Blocking twins live in :mod:`response_compaction.sync`.
"""

import typing as _typing

from ._compact import response_compact as response_compact
from ._compact import response_compaction_read_exact as response_compaction_read_exact
from ._errors import SchemaError as SchemaError
from ._errors import StoreError as StoreError
from ._errors import UnsafeStoreError as UnsafeStoreError
from ._harness import Harness as Harness
from ._harness import HarnessLike as HarnessLike
from ._harness import LocalWorkspace as LocalWorkspace
from ._harness import Workspace as Workspace
from ._ladder import RungReply as RungReply
from ._ladder import SummaryModel as SummaryModel
from ._models import Attempt as Attempt
from ._models import Broken as Broken
from ._models import Compacted as Compacted
from ._models import CompactionOptions as CompactionOptions
from ._models import ExactOutput as ExactOutput
from ._models import FallbackOutput as FallbackOutput
from ._models import Found as Found
from ._models import Missing as Missing
from ._models import Receipt as Receipt
from ._models import SummarizedOutput as SummarizedOutput
from ._openai import OpenAICatalog as OpenAICatalog
from ._part import Part as Part
from ._profile import Profile as Profile
from ._prompt import SummaryRequest as SummaryRequest
from ._read import response_compaction_read_part as response_compaction_read_part

__all__ = (
    "Attempt",
    "Broken",
    "Compacted",
    "CompactionOptions",
    "ExactOutput",
    "FallbackOutput",
    "Found",
    "Harness",
    "HarnessLike",
    "LocalWorkspace",
    "Missing",
    "OpenAICatalog",
    "Part",
    "Profile",
    "Receipt",
    "RungReply",
    "SchemaError",
    "StoreError",
    "SummarizedOutput",
    "SummaryModel",
    "SummaryRequest",
    "UnsafeStoreError",
    "Workspace",
    "response_compact",
    "response_compaction_read_exact",
    "response_compaction_read_part",
)


if _typing.TYPE_CHECKING:
    __version__: str


def __getattr__(name: str) -> str:
    # Looked up on first use: importlib.metadata cost 15-25 ms of every import here, and the
    # import budget is 150 ms. pyproject.toml is the one place the version is written.
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import metadata

    try:
        version = metadata.version("response-compaction")
    except metadata.PackageNotFoundError:  # pragma: no cover - only without an install
        version = "0+unknown"
    globals()["__version__"] = version
    return version
