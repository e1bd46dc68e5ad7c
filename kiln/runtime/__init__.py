"""What runs compiled graphs: fallbacks to eager today; compile workers, caches and loaders later."""
