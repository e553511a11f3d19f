"""Agent templates: a run's Jinja template rendered for one rollout into an agent Job, in a sandbox, and
checked (its structure, the Job's schema, the pod policy).

Neutral: the operator renders them off its event loop (`renderer.py`), and local mode, the agent pool
runner and `asyncrl validate` / `render-agent-job` render them in process. It imports no component."""
