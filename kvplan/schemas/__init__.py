"""JSON Schemas of kvplan's --json documents (estimate.schema.json); tests validate real output against them."""
