"""The run folder and what lasts: records, checkpoints, clients' state on disk, locks."""
