"""The sharding planner and what it plans with: stable keys, labels, splits, the features a
conversion declares, and the manifest assembled from what the writers report."""
