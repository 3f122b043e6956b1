"""rune_fast: a durable, fast store for LLM agent conversation history and task state."""
