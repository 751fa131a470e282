"""What `convert` and `inspect` report: the summary of a manifest and statistics of records, as
plain data and text."""
