"""kvplan's bundled offline model library: verbatim config.json files (provenance in SOURCES.md)."""
