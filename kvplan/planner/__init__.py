"""The planner: one verdict per deployment, the fixes that make it fit, and the search over deployments."""
