"""Model sources: the bundled library, the Hugging Face Hub (the only network edge), and the resolver."""
