"""`python -m kvplan` runs the CLI."""

from kvplan.cli import main

main()
