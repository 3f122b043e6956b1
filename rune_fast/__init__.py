"""rune_fast: durable, fast storage for LLM agent conversation history and task state."""
