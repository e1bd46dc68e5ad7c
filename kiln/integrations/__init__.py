"""kiln seen from other tools: torch.compile backends (dynamo.py)."""
