"""Images: the header probe and its per-format readers, whole-file integrity checks, records for
planning, and opt-in preprocessing."""
