"""Gates composed above the stages (each runs several stages, so no stage may hold it)."""
