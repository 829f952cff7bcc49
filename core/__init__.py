"""The leaf package every layer shares: knob catalog, scenarios and their arrivals, station, run-record
schema, metrics, Summary / Verdict / Contract, TrialSpec / TrialResult, simulator profiles as data.
It imports nothing else of the project."""
