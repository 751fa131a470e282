"""Files and paths: walking local sources, confinement, names that are not UTF-8, which source
owns a file, what a listing skips, the dataset's file names, staged parts, the directory swap."""
