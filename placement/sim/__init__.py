"""The simulator and the placement benchmark: traces, synthetic fleets, offline runs."""
