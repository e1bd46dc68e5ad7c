"""ATen graph -> loop IR: one small lowering per op in one table (registry.py); the rest are externs."""
