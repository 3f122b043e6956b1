"""The rooms behind :class:`rune_fast.conversation_state.ConversationStateRepository`.

The repository class is a facade: argument checks, the lock, one call per
public method. Each module here owns one piece of the store's state (see
docs/DESIGN.md, "The repository's rooms"). Nothing here is public API.
"""
