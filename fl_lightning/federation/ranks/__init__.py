"""Ranks and collectives: who works and who waits, what crosses a collective, liveness, launchers."""
