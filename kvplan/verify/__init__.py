"""`kvplan verify`: allocate the planned KV cache with torch, decode through it, compare with the estimate."""
