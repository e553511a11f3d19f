"""A toy multi-turn agent for the quickstart (see examples/toy_agent/agent.py)."""
