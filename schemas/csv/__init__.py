"""CSV tables' schema: the document's dialect, a sample's inferred column types, cell parsing."""
