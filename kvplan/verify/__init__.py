"""`kvplan verify`: allocate the planned KV cache with torch, run a cached decode through it, compare to the estimate."""
