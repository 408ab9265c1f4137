"""The lab around the library: planning runs, running them, reporting them, and the command line.

Nothing here is needed to run one simulation in-process (``fl_lightning.federation.simulation.Simulation``).
"""
