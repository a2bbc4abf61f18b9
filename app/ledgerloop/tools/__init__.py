"""Tools: the registry and decorator, the policy file, error classes, payload offload."""
