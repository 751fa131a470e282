"""What `verify` and `inspect` compute: checks of shards against a manifest, the HTML page.

Pure code (no Beam, no file access of its own); the commands in pipelines/ do the reading."""
