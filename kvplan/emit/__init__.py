"""What kvplan writes for a planned deployment: the engine's command line and deployment files."""
