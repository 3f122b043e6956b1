"""Drop-in history backends for agent frameworks.

Each framework has its own module, imported on demand (``import rune_fast``
imports none of them, nor any framework):

- ``rune_fast.integrations.agents``: :class:`RuneSession`, a ``Session`` for
  the OpenAI Agents SDK (``pip install "rune_fast[agents]"``);
- ``rune_fast.integrations.langchain``: :class:`RuneChatMessageHistory`, a
  LangChain ``BaseChatMessageHistory`` (``pip install "rune_fast[langchain]"``);
- ``rune_fast.integrations.langgraph``: :class:`RuneCheckpointSaver`, a
  LangGraph checkpointer (``pip install "rune_fast[langgraph]"``), in a
  checkpoint log of its own (docs/FORMAT.md, "LangGraph checkpoints").

The first two store each item as one message record of a conversation repository
(docs/FORMAT.md, "Framework items"); ``rune_fast.integrations._shared`` holds
what they share: the per-process registry of open repositories and the item
codec.
"""
