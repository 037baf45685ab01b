"""Target legalization: make every node's types legal for the target runtime."""
