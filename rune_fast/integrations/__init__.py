"""Integrations of rune_fast with agent frameworks (each needs its extra)."""
