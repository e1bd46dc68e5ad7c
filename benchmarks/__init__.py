"""`kiln bench`: eager, torch.compile and kiln side by side on real models (see README)."""
