"""Adapters for agent frameworks: compact a tool's result, and read it back.

Each framework has its own module behind its own extra, importing the framework only there:

- :mod:`response_compaction.integrations.openai_agents` (``openai-agents``)
- :mod:`response_compaction.integrations.pydantic_ai` (``pydantic-ai``)
- :mod:`response_compaction.integrations.langchain` (``langchain``)

All of them take one :class:`Compactor` (the harness and the options, given once).
"""

from ._core import READ_EXACT_DESCRIPTION as READ_EXACT_DESCRIPTION
from ._core import AgentSummary as AgentSummary
from ._core import Compactor as Compactor

__all__ = ("READ_EXACT_DESCRIPTION", "AgentSummary", "Compactor")
