"""Manifest files as the command line reads them: `asyncrl validate`, `render-agent-job` and `local run`."""
