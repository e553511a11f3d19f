"""asyncrl: collocated asynchronous RL training of LLM agents, run by a Kubernetes operator."""

__version__ = "0.1.0.dev0"
