"""Tests of the agent Job templates (src/asyncrl/agent_templates): rendering, typos, the pod policy."""
