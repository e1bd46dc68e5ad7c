"""ATen graph -> ATen graph: what the backend does to a graph before lowering it, in the order
`pipeline.py` lists. Rewrites edit the graph they are given in place and say whether they changed
it; size specialization and freezing's constant split are named steps of the same list."""
