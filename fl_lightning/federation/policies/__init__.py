"""Update policies: what happens to an update between client and server (docs/policies.md)."""
