"""What a run's reconciler and its rollout dispatcher share, below both: the run as last read
(`run_context.py`) and the link to the run's gateway (`gateway_link.py`), with the Job counters it derives
from the gateway's launch totals (`job_counters.py`).

The run's supervisor (`run_supervisor.py`) builds one of each and hands them to both sides, which never
import each other."""
