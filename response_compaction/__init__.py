"""Keep large agent responses exact on disk; hand the agent the value, a summary, or a fallback.

>>> compacted = await response_compact(harness, response, Exact, Summary, options)
>>> compacted.output.kind            # "exact" | "summarized" | "fallback"
>>> await response_compaction_read_exact(harness, compacted.receipt.exact_ref, Exact)

Blocking twins live in :mod:`response_compaction.sync`.
"""

from importlib import metadata as _metadata

from ._compact import response_compact as response_compact
from ._compact import response_compaction_read_exact as response_compaction_read_exact
from ._errors import SchemaError as SchemaError
from ._errors import StoreError as StoreError
from ._errors import UnsafeStoreError as UnsafeStoreError
from ._harness import Harness as Harness
from ._harness import HarnessLike as HarnessLike
from ._harness import LocalWorkspace as LocalWorkspace
from ._harness import Workspace as Workspace
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
from ._read import response_compaction_read_part as response_compaction_read_part
from ._summarize import RungReply as RungReply
from ._summarize import SummaryModel as SummaryModel
from ._summarize import SummaryRequest as SummaryRequest

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


def _version() -> str:
    # pyproject.toml is the one place the version is written; an uninstalled checkout has none.
    try:
        return _metadata.version("response-compaction")
    except _metadata.PackageNotFoundError:  # pragma: no cover - only without an install
        return "0+unknown"


__version__ = _version()
