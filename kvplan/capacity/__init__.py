"""The capacity layer: KV bytes, weights per GPU, and the plan that fits them to a GPU."""
