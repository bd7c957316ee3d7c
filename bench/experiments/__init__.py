"""Finished experiments kept because a maintainer may rerun them; their conclusions are in docs/decisions.md."""
