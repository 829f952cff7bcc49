"""The LangGraph loop around the planner: the graph (`graph.py` wires, `nodes.py` acts), the loop's checkpointed
state (`state.py`), a session (`session.py`), approvals, the record between the loop and the store
(`record.py`), progress and the way back to the best station (`restore.py`).
"""
