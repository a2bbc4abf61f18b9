"""Example downstream services used by demos, integration and crash tests."""
