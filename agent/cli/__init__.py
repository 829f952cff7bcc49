"""The commands that compose a store, an executor and the planner: `tuneloop run` (`run.py`), the steering
commands (`steer.py`), `tuneloop exec` (`exec.py`) and `tuneloop report` (`report.py`). Each defers its
commands' imports so `tuneloop --help` stays light.
"""
