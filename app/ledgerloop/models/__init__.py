"""Model access: the Anthropic client wrapper, model tiers and the scripted Messages API server."""
