"""Schedule primitives, one family per module; `kiln.tir.schedule.Schedule` is their front."""
