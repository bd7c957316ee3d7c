"""The GPU check kit: one command that checks the engine and the service on a GPU machine."""
