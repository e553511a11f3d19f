"""Local mode: run an AsyncTrainingRun manifest on one machine (gateway, trainer, agents as processes)."""
