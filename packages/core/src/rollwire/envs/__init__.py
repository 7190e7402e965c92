"""Demo environments: tasks, agents and rewards that run end to end on the embedded engine."""
