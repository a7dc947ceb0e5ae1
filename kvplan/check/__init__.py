"""`kvplan check`: read deployment files into requests (files.py), evaluate them with the engine models
(evaluate.py), and report (report.py). Kept empty so that loading the CLI does not load the YAML readers."""
